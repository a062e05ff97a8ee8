"""`tapebench render model-error` and `tapebench render sweep`: the world-model credibility outputs."""
from __future__ import annotations


def register(sub) -> None:
    from .tables import render_subcommands

    tables = render_subcommands(sub)
    t = tables.add_parser("model-error", help="world models: success beside open-loop prediction error, ID/OOD",
                          description="Each world-model method's ID / OOD success beside its one-step and "
                                      "depth-D prediction error on ID and OOD rules (LaTeX), and the figure of "
                                      "error vs depth (PDF + PNG).")
    t.add_argument("--model-error", required=True, help="aggregate from `tapebench aggregate-model-error`")
    t.add_argument("--aggregate", help="aggregate Parquet from `tapebench aggregate` (for the success columns)")
    t.add_argument("--split", required=True, help="split name")
    t.add_argument("--H", type=int, default=32, help="evaluation horizon of the success columns (default 32)")
    t.add_argument("--depth", type=int, default=16, help="the deep open-loop column (default 16)")
    t.add_argument("--out", required=True, help="output .tex")
    t.add_argument("--figure", help="also write the error-vs-depth figure to FIGURE.pdf and FIGURE.png")
    t.set_defaults(func=_model_error)

    t = tables.add_parser("sweep", help="one hyperparameter of one method vs success and one-step error",
                          description="A sensitivity sweep (e.g. the DreamerV3 imagination horizon): per value, "
                                      "ID / OOD success and one-step prediction error with bootstrap CIs over "
                                      "seeds; LaTeX, Parquet and a figure.")
    t.add_argument("--method", required=True, help="the swept method's id")
    t.add_argument("--hyperparameter", required=True, help="the swept field of its Config")
    t.add_argument("--values", nargs="+", type=int, required=True, help="the swept values, in order")
    t.add_argument("--per-seed", nargs="+", required=True, help="one per-seed table per value (same order)")
    t.add_argument("--model-error", nargs="+", required=True, help="one model-error aggregate per value")
    t.add_argument("--split", required=True, help="split name")
    t.add_argument("--H", type=int, default=32, help="evaluation horizon (default 32)")
    t.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    t.add_argument("--ci", type=float, default=0.95, help="confidence level (default 0.95)")
    t.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    t.add_argument("--out", required=True, help="output .tex")
    t.add_argument("--parquet", help="also write the summary table")
    t.add_argument("--figure", help="also write the figure to FIGURE.pdf and FIGURE.png")
    t.set_defaults(func=_sweep)


def _model_error(args) -> int:
    from .world_model import render_model_error

    render_model_error(args.model_error, args.out, aggregate_path=args.aggregate, split=args.split, H=args.H,
                       depth=args.depth, figure=args.figure)
    print(f"render model-error: {args.out}" + (f" and {args.figure}.pdf/.png" if args.figure else ""))
    return 0


def _sweep(args) -> int:
    from .world_model import render_sweep

    render_sweep(args.values, args.per_seed, args.model_error, args.out, method=args.method,
                 hyperparameter=args.hyperparameter, H=args.H, split=args.split, parquet=args.parquet,
                 figure=args.figure, n_resamples=args.n_resamples, ci=args.ci, seed=args.seed)
    print(f"render sweep: {args.out}")
    return 0
