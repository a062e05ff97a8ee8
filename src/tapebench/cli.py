"""The `tapebench` command line. Each area registers its subcommands from its own `cli` module."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define `register(subparsers)`; each subcommand sets `func(args) -> int | None`.
SUBCOMMAND_MODULES = (
    "tapebench.training.cli",
    "tapebench.bench",
    "tapebench.rules.cli",
    "tapebench.splits.cli",
    "tapebench.stats.cli",
    "tapebench.oracle.cli",
    "tapebench.status",
)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="tapebench", description=__doc__)
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
