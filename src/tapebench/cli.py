"""The `tapebench` command line. Each area registers its commands from its own module in `tapebench.commands`
(benchmarks: `tapebench.bench`)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from tapebench import __version__
from tapebench.utils import job_client

DESCRIPTION = """\
The commands behind the TAPE benchmark pipeline. Snakemake normally runs them for you:

  snakemake --cores 2 results/quick/table3.tex --configfile config/quick.yaml   (reduced preset)
  snakemake --cores 8 results/table3.tex                                   (paper protocol)

Run a command by hand to inspect or redo one step; `tapebench COMMAND --help` explains it.
"""
EPILOG = """\
while the pipeline runs:
  tapebench status                  every training run: done / running / failed, progress, ETA
  tapebench config --configfile F   check a preset and show the configuration it gives

protocol and decisions: docs/protocol.md
"""

# Every command: the module that builds its parser and runs it (`register(subparsers)`, each command setting
# `func(args) -> int | None`), and its one-line help. A command imports its module only when it runs, so
# `tapebench --help` and each command start without loading what other commands need.
COMMANDS = {
    "train": ("tapebench.commands.training", "train one agent for one seed (resumable checkpoints)"),
    "evaluate": ("tapebench.commands.training", "evaluate a trained run or a method that does not train"),
    "model-error": ("tapebench.commands.training", "a world model's open-loop prediction error on ID and OOD rules"),
    "worldtest": ("tapebench.commands.worldtest", "world test: reward-free interaction with a hidden rule, then derived tasks"),
    "fewshot": ("tapebench.commands.fewshot", "few-shot study: success on a rule's fresh episodes after k episodes of it"),
    "methods": ("tapebench.commands.methods", "list the registered methods (agents, planners, reference rows)"),
    "bench": ("tapebench.bench", "measure throughput (CA kernel, environment, MPC, DP, training)"),
    "features": ("tapebench.commands.rules", "per-rule features and operational types (stable / periodic / chaotic)"),
    "rule-set": ("tapebench.commands.rules", "sample a rule set of a k-colour radius-r family by Langton's lambda bins"),
    "grid-features": ("tapebench.commands.rules", "features and types of 2D grid rules: all von Neumann rules or a Moore sample"),
    "identifiability": ("tapebench.commands.rules", "observed transitions until the rule is identified, per episode"),
    "split": ("tapebench.commands.splits", "build a train/test rule split from the rule features"),
    "ladder-split": ("tapebench.commands.splits", "build a severity ladder: test rules at exact distance d from a small training set"),
    "split-health": ("tapebench.commands.splits", "check a split for overlap and mirror leaks (non-zero exit if it fails)"),
    "aggregate-seed": ("tapebench.commands.stats", "per-episode records -> per-seed values (mean of the last K checkpoints)"),
    "aggregate": ("tapebench.commands.stats", "per-seed values -> bootstrap means and CIs over seeds, paired drop"),
    "aggregate-model-error": ("tapebench.commands.stats", "world-model prediction errors -> means and CIs over seeds"),
    "aggregate-worldtest": ("tapebench.commands.stats", "world-test scores -> means and CIs over seeds per method, task, side, budget"),
    "aggregate-fewshot": ("tapebench.commands.fewshot", "few-shot records -> success vs k per method and side, CIs over seeds"),
    "protocol-comparison": ("tapebench.commands.stats", "Kendall tau between method rankings across protocols"),
    "mpc": ("tapebench.commands.oracle", "true-dynamics random-shooting MPC on evaluation episodes -> records"),
    "exact": ("tapebench.commands.oracle", "exact optimal controller (DP over all 2^L tapes, L <= 20) -> records"),
    "feasibility": ("tapebench.commands.oracle", "exact per-rule reachability of the goal within H (L <= 20)"),
    "oracle-gap": ("tapebench.commands.oracle", "MPC vs exact optimum on the same episodes, per rule / type / overall"),
    "export-mpc-by-type": ("tapebench.commands.oracle", "MPC strict success / mean return / n by rule type -> JSON"),
    "benchmark-health": ("tapebench.commands.health", "benchmark health report of a split -> JSON + per-rule Parquet"),
    "health-gate": ("tapebench.commands.health", "stop (non-zero exit) if a split failed a fatal health check"),
    "render": ("tapebench.commands.report", "render a table or figure from pipeline artifacts"),
    "report": ("tapebench.commands.report", "the compiled report: every table and figure of a config in one PDF"),
    "status": ("tapebench.commands.status", "show where a pipeline run stands: each training run's state, progress and ETA"),
    "reference": ("tapebench.commands.reference", "reference sets: list, show, verify, pack, reproduce a cell, the reproduction report, the results page"),
    "docs": ("tapebench.commands.docs", "render docs/compute.md from the measured figures in docs/measurements/*.json"),
    "config": ("tapebench.commands.pipeline", "check a config (or preset) and show the configuration the pipeline would use"),
}


class _HelpFromTable:
    """The subparsers action as a command module sees it: `add_parser` takes its one-line help from COMMANDS."""

    def __init__(self, subparsers):
        self._subparsers = subparsers

    def add_parser(self, name, **kwargs):
        if name not in COMMANDS:
            raise KeyError(f"command {name!r} is not listed in tapebench.cli.COMMANDS")
        return self._subparsers.add_parser(name, help=COMMANDS[name][1], **kwargs)


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The `tapebench` parser. The modules of `commands` (default: every command) build their full parsers;
    the other commands are listed by their one-line help only."""
    parser = argparse.ArgumentParser(prog="tapebench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tapebench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = {COMMANDS[c][0] for c in (COMMANDS if commands is None else commands)}
    loaded = set()
    for name, (module, help_line) in COMMANDS.items():
        if module in wanted and module not in loaded:
            importlib.import_module(module).register(_HelpFromTable(sub))
            loaded.add(module)
        elif module not in loaded:
            sub.add_parser(name, help=help_line, description=help_line)
    return parser


def requested_command(argv: list[str]) -> list[str]:
    """The command named on the command line (the first argument that is not an option), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return [first] if first in COMMANDS else []


def numba_threads_of_the_job(environ=os.environ) -> None:
    """NUMBA_NUM_THREADS, where it is not set, from OMP_NUM_THREADS: Snakemake sets that to every job's `threads`,
    and numba's default, every core, would let a one-thread job's parallel kernels take its neighbours' cores."""
    threads = environ.get("OMP_NUM_THREADS", "").strip()
    if "NUMBA_NUM_THREADS" not in environ and threads.isdigit() and int(threads) >= 1:
        environ["NUMBA_NUM_THREADS"] = threads


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    numba_threads_of_the_job()                    # before numba is imported, and in what a job server receives
    status = job_client.forward(argv)             # a pipeline's job server runs it in a fork, when there is one
    if status is not None:
        return status
    parser = build_parser(requested_command(argv))
    args = parser.parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()      # a reader that closed the pipe is met here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        return closed_pipe()
    except (ValueError, FileNotFoundError) as exc:
        print(f"tapebench {args.command}: error: {exc}", file=sys.stderr)
        return 2


SIGPIPE_STATUS = 128 + 13   # what a shell reports for a process a closed pipe ended


def closed_pipe() -> int:
    """The reader of stdout went away (`tapebench methods -v | head`): stop quietly, as a command ended by SIGPIPE
    does, and point stdout at /dev/null so the interpreter's last flush raises nothing either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a captured stdout): nothing is left to flush
        pass
    return SIGPIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
