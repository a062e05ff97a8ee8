"""Split robustness (paper §6.5, Figure 5; docs/protocol.md#split-robustness): the methods trained and evaluated on
several partitions of the rules (farthest-point "diverse" and seeded random), their OOD strict success per
partition (mean over seeds, from each split's aggregate table), its spread across partitions, and how stable
the methods' ranking is (rank per partition, 1 = best, ties averaged; Kendall's tau-b between the rankings of
every pair of partitions).
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy import stats as sps

from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, pyplot, save_figure
from tapebench.report.tables import display_name
from tapebench.utils.artifacts import read_table
from tapebench.utils.io import write_parquet

# One style per partition (Okabe-Ito colours other than the three rule-type colours, and a marker each).
PARTITION_COLOURS = ("#000000", "#D55E00", "#CC79A7", "#56B4E9", "#999999", "#F0E442")
PARTITION_MARKERS = ("o", "s", "^", "v", "D", "P")


def per_partition(aggregates: dict[str, pd.DataFrame], *, L: int, H: int, agents: list[str] | None = None,
                  metric: str = "success") -> pd.DataFrame:
    """One row per (split, agent): OOD mean over seeds with its CI, n seeds, rank within the split."""
    rows = []
    for split, agg in aggregates.items():
        sel = agg[(agg["split"] == split) & (agg["L"] == L) & (agg["H"] == H) & (agg["side"] == "test")
                  & (agg["metric"] == metric)]
        if sel.empty:
            raise ValueError(f"the aggregate of split {split!r} has no OOD {metric} at L = {L}, H = {H}")
        present = list(dict.fromkeys(sel["agent"].astype(str)))
        wanted = agents or present
        missing = [a for a in wanted if a not in present]
        if missing:
            raise ValueError(f"the aggregate of split {split!r} lacks methods {missing}; it has {present}")
        for agent in wanted:
            r = sel[sel["agent"] == agent].iloc[0]
            rows.append({"split": split, "agent": agent, "mean": float(r["mean"]), "ci_low": float(r["ci_low"]),
                         "ci_high": float(r["ci_high"]), "n_seeds": int(r["n"])})
    table = pd.DataFrame(rows)
    table["rank"] = table.groupby("split")["mean"].rank(ascending=False, method="average")
    return table


def rank_summary(table: pd.DataFrame, splits: list[str]) -> tuple[pd.DataFrame, float]:
    """Per method: mean / sd / min / max of OOD success over partitions, rank per partition, mean rank and the
    rank range; and the mean Kendall tau-b between the rankings of all pairs of partitions."""
    rows = []
    for agent, grp in table.groupby("agent", sort=False):
        by_split = grp.set_index("split")
        means = by_split.loc[splits, "mean"].to_numpy(np.float64)
        ranks = by_split.loc[splits, "rank"].to_numpy(np.float64)
        rows.append({"agent": agent, "mean": float(means.mean()),
                     "sd": float(means.std(ddof=1)) if len(means) > 1 else float("nan"),
                     "min": float(means.min()), "max": float(means.max()), "mean_rank": float(ranks.mean()),
                     "rank_range": float(ranks.max() - ranks.min()),
                     **{f"rank_{s}": float(r) for s, r in zip(splits, ranks)}})
    taus = []
    pivot = table.pivot(index="agent", columns="split", values="mean")
    for a, b in itertools.combinations(splits, 2):
        tau = sps.kendalltau(pivot[a], pivot[b]).statistic
        if np.isfinite(tau):
            taus.append(float(tau))
    return pd.DataFrame(rows), float(np.mean(taus)) if taus else float("nan")


def figure5(table: pd.DataFrame, splits: list[str], kinds: dict[str, str], stem, *, L: int, H: int) -> list[str]:
    """Box plot of OOD success across partitions per method, with one marked point per partition."""
    plt = pyplot()
    agents = list(dict.fromkeys(table["agent"]))
    width = max(COLUMN_WIDTH, 0.45 * len(agents) + 1.2)
    fig, ax = plt.subplots(figsize=(width, 2.6))
    data = [table[table["agent"] == a].set_index("split").loc[splits, "mean"].to_numpy() for a in agents]
    ax.boxplot(data, positions=range(len(agents)), widths=0.55, showfliers=False,
               medianprops={"color": "#000000"}, boxprops={"color": "#555555"}, whiskerprops={"color": "#555555"},
               capprops={"color": "#555555"})
    offsets = np.linspace(-0.2, 0.2, len(splits)) if len(splits) > 1 else np.zeros(1)
    for j, split in enumerate(splits):
        xs = np.arange(len(agents)) + offsets[j]
        ys = [table[(table["agent"] == a) & (table["split"] == split)]["mean"].iloc[0] for a in agents]
        colour = PARTITION_COLOURS[j % len(PARTITION_COLOURS)]
        hollow = kinds.get(split) == "random"
        ax.scatter(xs, ys, s=14, marker=PARTITION_MARKERS[j % len(PARTITION_MARKERS)], zorder=3,
                   facecolors="none" if hollow else colour, edgecolors=colour, linewidths=0.9,
                   label=f"{split} ({kinds.get(split, '?')})")
    ax.set_xticks(range(len(agents)))
    ax.set_xticklabels([display_name(a) for a in agents], rotation=35, ha="right")
    ax.set_ylabel("OOD strict success")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"Split robustness: {len(splits)} partitions ($L={L}$, $H={H}$)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="partition", title_fontsize=7)
    return save_figure(fig, stem)


def render_figure5(out, *, aggregate, splits, kinds, L, H, agents=None, table=None, parquet=None) -> list[str]:
    """Figure 5 at `out`.pdf / .png, and optionally the summary table (LaTeX) and the per-partition Parquet."""
    paths = render_robustness(table, aggregate=aggregate, splits=splits, kinds=kinds, L=L, H=H, agents=agents,
                              parquet=parquet, figure=out)
    return paths


def render_robustness(out, *, aggregate, splits, kinds, L, H, agents=None, parquet=None, figure=None):
    """The summary table at `out` (if given), the Parquet and the figure; returns the figure's paths."""
    if len(aggregate) != len(splits) or len(kinds) != len(splits):
        raise ValueError(f"give one aggregate table and one kind per split, in the same order; got {len(splits)} "
                         f"splits, {len(aggregate)} aggregate tables and {len(kinds)} kinds")
    aggregates = {s: read_table(p, "aggregate")[0] for s, p in zip(splits, aggregate)}
    table = per_partition(aggregates, L=int(L), H=int(H), agents=list(agents) if agents else None)
    summary, tau = rank_summary(table, list(splits))
    kind_of = dict(zip(splits, kinds))
    if parquet:
        write_parquet(parquet, table.merge(summary[["agent", "mean_rank", "rank_range"]], on="agent"),
                      meta={"table": "robustness", "splits": list(splits), "kinds": list(kinds), "L": int(L),
                            "H": int(H), "mean_kendall_tau": tau})
    paths = figure5(table, list(splits), kind_of, figure, L=int(L), H=int(H)) if figure else []
    if not out:
        return paths
    rows = [{"name": display_name(r["agent"]), "mean": r["mean"], "sd": r["sd"], "min": r["min"], "max": r["max"],
             "ranks": [r[f"rank_{s}"] for s in splits], "mean_rank": r["mean_rank"]}
            for r in summary.sort_values("mean_rank", kind="stable").to_dict("records")]
    seeds = {s: int(table[table["split"] == s]["n_seeds"].max()) for s in splits}
    render_table("robustness.tex.j2", out, rows=rows, splits=list(splits), kinds=kind_of, tau=tau, L=int(L),
                 H=int(H), seeds=seeds)
    return paths
