"""`tapebench docs`: pages of docs/ rendered from data (docs/compute.md from the measured figures in
docs/measurements/*.json)."""
from __future__ import annotations

import sys

from tapebench.commands import write_generated


def register(sub) -> None:
    p = sub.add_parser("docs", description="Render a page of docs/ from its data, never by hand: `compute` writes "
                                           "docs/compute.md from the figures of docs/measurements/*.json (one row "
                                           "per figure: value, unit, command, machine, commit, date).")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="PAGE")
    v = verbs.add_parser("compute", help="docs/compute.md from docs/measurements/*.json",
                         description="Render docs/compute.md from the measured figures in docs/measurements/*.json.")
    v.add_argument("--measurements", default="docs/measurements",
                   help="folder of the measurement files (default docs/measurements)")
    v.add_argument("--out", required=True, help="Markdown file (docs/compute.md)")
    v.add_argument("--check", action="store_true", help="do not write: exit 1 if the file is not what it would be")
    v.set_defaults(func=_compute)


def _compute(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.report.measurements import MeasurementError, compute_markdown

    try:
        text = compute_markdown(args.measurements)
    except MeasurementError as exc:
        print(f"tapebench docs compute: {exc}", file=sys.stderr)
        return 1
    return write_generated({args.out: text}, args.check, f"tapebench docs compute --out {args.out}")
