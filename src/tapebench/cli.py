"""The `tapebench` command line. Each area registers its subcommands from its own `cli` module."""
from __future__ import annotations

import argparse
import importlib
import sys

DESCRIPTION = """\
The commands behind the TAPE benchmark pipeline. Snakemake normally runs them for you:

  snakemake --cores 2 results/table3.tex --configfile config/quick.yaml   (reduced preset)
  snakemake --cores 8 results/table3.tex                                   (paper protocol)

Run a command by hand to inspect or redo one step; `tapebench COMMAND --help` explains it.
"""
EPILOG = """\
while the pipeline runs:
  tapebench status                  every training run: done / running / failed, progress, ETA
  tapebench config --configfile F   check a preset and show the configuration it gives

protocol and decisions: docs/protocol.md
"""

# Modules that define `register(subparsers)`; each subcommand sets `func(args) -> int | None`.
SUBCOMMAND_MODULES = (
    "tapebench.training.cli",
    "tapebench.methods.cli",
    "tapebench.bench",
    "tapebench.rules.cli",
    "tapebench.splits.cli",
    "tapebench.stats.cli",
    "tapebench.oracle.cli",
    "tapebench.health.cli",
    "tapebench.report.registry",
    "tapebench.report.document",
    "tapebench.status",
    "tapebench.pipeline.cli",
)


def build_parser() -> argparse.ArgumentParser:
    from tapebench import __version__

    parser = argparse.ArgumentParser(prog="tapebench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tapebench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"tapebench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
