"""tapebench: reproducible pipeline for the TAPE cellular-automata rule-shift RL benchmark.

Importing the package registers the Gymnasium ids "tapebench/Tape-v0" and "tapebench/Grid-v0"
(`tapebench.gymnasium_ids`) without importing Gymnasium itself; the layers are described in docs/architecture.md.
"""
from tapebench.gymnasium_ids import register_on_import

__version__ = "0.4.0"

register_on_import()
