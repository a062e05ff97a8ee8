"""A method placed beside a reference set (docs/protocol.md#reference-sets): for each method this run ran, its place
in Table 3 (ID and OOD strict success among every row) and the probability that it improves on each reference row
(P(X > Y) over rules, per-rule strict success, stratified-bootstrap CIs: `stats.rliable`), ID and OOD.

Outputs: `results/compare.parquet` (one row per method, reference row and side), `results/compare.tex`, and the
figure `results/figures/compare` (P(X > Y) with its CI per reference row, ID and OOD).
"""
from __future__ import annotations

import pandas as pd

from tapebench.defaults import CI, N_RESAMPLES
from tapebench.report import style
from tapebench.report.figures import _read_many
from tapebench.report.render import render_table
from tapebench.report.rliable_outputs import side_matrices
from tapebench.report.tables import display_name, load_aggregate, table_order
from tapebench.stats import rliable
from tapebench.stats.aggregate import group_generator
from tapebench.utils.io import provenance, write_parquet
from tapebench.vocabulary import SPLIT_SIDES

COMPARE_COLUMNS = ["method", "reference_method", "side", "probability", "ci_low", "ci_high", "n_seeds",
                   "n_seeds_reference", "n_rules", "place", "rows", "mean", "ci", "n_resamples"]


def places(agg: pd.DataFrame, split: str, H: int, agents: list[str]) -> dict:
    """{(agent, side): (place, rows, mean)}: the agent's rank by mean strict success among `agents` (1 = best;
    ties share the better place)."""
    out = {}
    for side in SPLIT_SIDES:
        rows = agg[(agg["split"] == split) & (agg["H"] == H) & (agg["side"] == side) & (agg["metric"] == "success")
                   & agg["agent"].isin(agents)]
        means = dict(zip(rows["agent"], rows["mean"].astype(float)))
        for agent, mean in means.items():
            out[(agent, side)] = (1 + sum(1 for m in means.values() if m > mean), len(means), mean)
    return out


def compare_frame(per_rule: pd.DataFrame, agg: pd.DataFrame, methods: list[str], reference_methods: list[str],
                  split: str, H: int, n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0) -> pd.DataFrame:
    """One row per (method, reference row, side): P(method > reference row) with its CI, and the method's place."""
    missing = [m for m in [*methods, *reference_methods] if m not in set(per_rule["agent"])]
    if missing:
        raise ValueError(f"the per-rule tables hold no rows of {missing}")
    ranked = places(agg, split, H, [*reference_methods, *methods])
    rows = []
    for side in SPLIT_SIDES:
        scores = side_matrices(per_rule, side, split, H)
        for method in methods:
            place, n_rows, mean = ranked.get((method, side), (None, None, float("nan")))
            for reference in reference_methods:
                x, y = scores[method], scores[reference]
                estimate = rliable.probability_of_improvement_ci(
                    x, y, n_resamples, ci, rng=group_generator(seed, (split, H, side, method, reference)))
                rows.append({"method": method, "reference_method": reference, "side": side,
                             "probability": float(estimate.point), "ci_low": float(estimate.low),
                             "ci_high": float(estimate.high), "n_seeds": int(x.shape[0]),
                             "n_seeds_reference": int(y.shape[0]), "n_rules": int(x.shape[1]), "place": place,
                             "rows": n_rows, "mean": mean, "ci": float(ci), "n_resamples": int(n_resamples)})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def render_compare(out, *, per_rule, aggregate, methods, reference_methods, split, H, reference_set=None,
                   n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0, parquet=None,
                   figure=None) -> str:
    methods, reference_methods = list(methods or []), table_order(reference_methods or [])
    agg, _ = load_aggregate(aggregate)
    frame = compare_frame(_read_many(per_rule, "per_rule"), agg, methods, reference_methods, split, int(H),
                          n_resamples, ci, seed)
    if parquet:
        write_parquet(parquet, frame, meta=provenance(
            {"split": split, "H": int(H), "methods": methods, "reference_methods": reference_methods,
             "reference_set": reference_set, "n_resamples": n_resamples, "ci": ci}, seed, table="compare",
            inputs=[str(p) for p in [*per_rule, aggregate]]))
    if figure:
        _figure(frame, figure, ci)
    blocks = []
    for method in methods:
        own = frame[frame["method"] == method]
        place = {side: own[own["side"] == side].iloc[0].to_dict() for side in SPLIT_SIDES
                 if (own["side"] == side).any()}
        rows = []
        for reference in reference_methods:
            cells = {}
            for side in SPLIT_SIDES:
                r = own[(own["side"] == side) & (own["reference_method"] == reference)]
                cells[side] = None if r.empty else r.iloc[0].to_dict()
            rows.append({"name": display_name(reference), "id": cells["train"], "ood": cells["test"]})
        blocks.append({"name": display_name(method), "place": place, "rows": rows})
    return render_table("compare.tex.j2", out, blocks=blocks, split=split, H=int(H), reference_set=reference_set,
                        ci_percent=f"{100 * ci:g}", n_resamples=n_resamples)


def _figure(frame: pd.DataFrame, stem, ci: float) -> list[str]:
    plt = style.pyplot()
    methods = list(dict.fromkeys(frame["method"]))
    references = list(dict.fromkeys(frame["reference_method"]))
    height = 1.1 + 0.28 * len(references)
    fig, axes = plt.subplots(1, len(methods), figsize=(min(style.FULL_WIDTH, 3.2 * len(methods)), height),
                             squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods):
        for k, side in enumerate(SPLIT_SIDES):
            part = frame[(frame["method"] == method) & (frame["side"] == side)].set_index("reference_method")
            ys = [i + (k - 0.5) * 0.3 for i in range(len(references))]
            p = part.loc[references]
            ax.errorbar(p["probability"], ys, xerr=[p["probability"] - p["ci_low"], p["ci_high"] - p["probability"]],
                        fmt=style.METHOD_MARKERS[k], color=style.METHOD_COLOURS[k], markersize=3, linewidth=0.8,
                        label=style.SIDE_LONG_LABELS[side])
        ax.axvline(0.5, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(references)), [display_name(r) for r in references])
        ax.set_ylim(len(references) - 0.4, -0.6)         # first row on top, room for both sides' markers
        ax.set_xlabel(f"P({display_name(method)} > row) [{100 * ci:g}% CI]")
    axes[0][0].legend(fontsize=6, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    return style.save_figure(fig, stem)
