"""Protocol comparison (docs/protocol.md#protocol-comparison): the table (each protocol against the reference:
Kendall's tau-b with its bootstrap CI, rank reversals, best method, P(best changes)) and the figure (tau between
every pair of protocols; each method's rank across protocols), from `tapebench protocol-comparison`'s tables."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.report.render import render_table
from tapebench.report.style import FULL_WIDTH, SIDE_LABELS, method_style, pyplot, save_figure
from tapebench.report.tables import display_name
from tapebench.stats.protocol_comparison import LOWER_IS_BETTER
from tapebench.utils.artifacts import read_table


def _read(comparison, ranks):
    table, meta = read_table(comparison, "protocol_comparison")
    rank_table, _ = read_table(ranks, "protocol_ranks")
    return table, rank_table, meta


def _protocol_order(rank_table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(rank_table["protocol"]))


def _best_names(best: str) -> str:
    return " / ".join(display_name(a) for a in best.split("/")) if best else "--"


def render_protocol_table(out, *, comparison, ranks) -> str:
    """One row per protocol, the reference first: its selection, number of methods, tau vs the reference with
    its CI, reversals (bootstrap expected number), its best method and P(best method differs)."""
    table, rank_table, meta = _read(comparison, ranks)
    order = _protocol_order(rank_table)
    reference = order[0]
    vs_ref = table[table["reference"]].set_index("protocol_b")
    info = rank_table.drop_duplicates("protocol").set_index("protocol")
    seeds = rank_table.groupby("protocol")["n_seeds"].max()
    rows = []
    for name in order:
        proto = info.loc[name]
        row = {"name": name, "split": proto["split"], "H": int(proto["H"]),
               "side": SIDE_LABELS.get(proto["side"], proto["side"]), "seeds": int(seeds[name]),
               "n_methods": int((rank_table["protocol"] == name).sum()),
               "best": _best_names("/".join(rank_table[(rank_table["protocol"] == name) & rank_table["best"]]["agent"]))}
        if name != reference:
            r = vs_ref.loc[name]
            row.update({"n_methods": int(r["n_methods"]), "tau": float(r["tau"]), "tau_low": float(r["tau_ci_low"]),
                        "tau_high": float(r["tau_ci_high"]), "reversals": int(r["n_reversals"]),
                        "expected": float(r["expected_reversals"]), "pairs": int(r["n_pairs"]),
                        "p_change": float(r["p_best_changes"])})
        rows.append(row)
    metric = meta.get("metric", "success")
    return render_table("protocol_comparison.tex.j2", out, rows=rows, reference=reference, metric=metric,
                        lower=metric in LOWER_IS_BETTER, ci=float(table["ci"].iloc[0]),
                        n_resamples=int(table["n_resamples"].iloc[0]))


def _tau_matrix(table: pd.DataFrame, order: list[str]) -> np.ndarray:
    tau = np.eye(len(order))
    index = {name: i for i, name in enumerate(order)}
    for r in table.itertuples():
        i, j = index[r.protocol_a], index[r.protocol_b]
        tau[i, j] = tau[j, i] = r.tau
    return tau


def render_protocol_figure(out, *, comparison, ranks) -> list[str]:
    """Left: Kendall's tau-b between every pair of protocols. Right: each method's rank per protocol (bump chart,
    1 = best), with its bootstrap rank interval."""
    table, rank_table, meta = _read(comparison, ranks)
    order = _protocol_order(rank_table)
    agents = list(dict.fromkeys(rank_table["agent"]))
    tau = _tau_matrix(table, order)
    plt = pyplot()
    size = max(2.6, 0.32 * len(order) + 1.3)
    if len(order) <= 6:
        fig, (left, right) = plt.subplots(1, 2, figsize=(FULL_WIDTH, size), gridspec_kw={"width_ratios": [1, 1.25]})
    else:       # many protocols: the heat map gets the full width so that its numbers stay legible
        fig, (left, right) = plt.subplots(2, 1, figsize=(FULL_WIDTH, 2 * size + 0.6),
                                          gridspec_kw={"height_ratios": [1.3, 1]})
    image = left.imshow(np.ma.masked_invalid(tau), cmap="RdBu", vmin=-1, vmax=1)
    for i in range(len(order)):
        for j in range(len(order)):
            text = "--" if not np.isfinite(tau[i, j]) else f"{tau[i, j]:.2f}"
            colour = "white" if np.isfinite(tau[i, j]) and abs(tau[i, j]) > 0.6 else "black"
            left.text(j, i, text, ha="center", va="center", fontsize=6, color=colour)
    left.set_xticks(range(len(order)))
    left.set_xticklabels(order, rotation=45, ha="right")
    left.set_yticks(range(len(order)))
    left.set_yticklabels(order)
    left.set_title(r"Kendall $\tau_b$ between method rankings")
    fig.colorbar(image, ax=left, fraction=0.046, pad=0.03, ticks=[-1, 0, 1])

    xs = np.arange(len(order))
    offsets = np.linspace(-0.12, 0.12, len(agents)) if len(agents) > 1 else np.zeros(1)
    for k, agent in enumerate(agents):
        rows = rank_table[rank_table["agent"] == agent].set_index("protocol").reindex(order)
        style = method_style(k)
        x = xs + offsets[k]
        y = rows["rank"].to_numpy(np.float64)
        err = np.vstack([y - rows["rank_ci_low"].to_numpy(np.float64), rows["rank_ci_high"].to_numpy(np.float64) - y])
        right.errorbar(x, y, yerr=err, color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
                       markersize=3.5, linewidth=1.0, elinewidth=0.6, capsize=0, alpha=0.9, label=display_name(agent))
    right.set_xticks(xs)
    right.set_xticklabels(order, rotation=45, ha="right")
    right.set_ylim(len(agents) + 0.5, 0.5)
    right.set_yticks(range(1, len(agents) + 1))
    right.set_ylabel("rank (1 = best)")
    right.grid(axis="y", alpha=0.3)
    metric = meta.get("metric", "success")
    right.set_title(f"Rank by mean {metric} ({int(table['ci'].iloc[0] * 100)}% bootstrap interval)")
    right.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return save_figure(fig, out)
