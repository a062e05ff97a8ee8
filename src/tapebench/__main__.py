"""`python -m tapebench ...`: the `tapebench` command."""
import sys

from tapebench.cli import main

sys.exit(main())
