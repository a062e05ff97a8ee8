"""The noise study (docs/protocol.md#noise): strict success vs cell-update noise epsilon, ID and OOD, per method.

Input: one aggregate table per noise level (`tapebench aggregate` over that level's per-seed tables; at
epsilon = 0 the noise-free ones), in the order of the levels. Output: the "success vs epsilon" table (methods
grouped by family as in Tables 2-4, a column per level on each side, mean over seeds with its bootstrap CI on
the line below), a summary Parquet, and the figure (success vs epsilon per method, ID and OOD panels).
"""
from __future__ import annotations

import pandas as pd

from tapebench import defaults
from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, SIDE_LABELS, method_style, pyplot, save_figure
from tapebench.report.tables import _agents, _seeds_text, display_name, grouped
from tapebench.utils.artifacts import read_table
from tapebench.utils.io import provenance, write_parquet
from tapebench.vocabulary import SPLIT_SIDES

SUMMARY_COLUMNS = ["split", "agent", "L", "H", "noise", "side", "metric", "n", "mean", "ci_low", "ci_high"]


def noise_summary(aggregates: dict[float, pd.DataFrame], *, split: str, H: int, agents: list[str] | None = None,
                  metric: str = "success") -> pd.DataFrame:
    """One row per (agent, noise level, side) of `metric` (schema `SUMMARY_COLUMNS`), agents in table order."""
    if not aggregates:
        raise ValueError("the noise table needs at least one noise level")
    rows, order = [], None
    for noise, agg in sorted(aggregates.items()):
        sel = agg[(agg["split"] == split) & (agg["H"] == int(H)) & (agg["metric"] == metric)
                  & agg["side"].isin(SPLIT_SIDES)]
        if sel.empty:
            raise ValueError(f"the aggregate of noise level {noise:g} has no {metric} on split {split!r} at H = {H}")
        lengths = sorted(sel["L"].unique())
        if len(lengths) > 1:
            raise ValueError(f"the aggregate of noise level {noise:g} holds several tape lengths {lengths}")
        level_agents = _agents(sel, agents)
        if order is None:
            order = level_agents
        missing = [a for a in order if a not in set(sel["agent"].astype(str))]
        if missing:
            raise ValueError(f"the aggregate of noise level {noise:g} lacks methods {missing}; every level needs "
                             f"the same methods")
        for r in sel[sel["agent"].isin(order)].itertuples(index=False):
            rows.append({"split": split, "agent": str(r.agent), "L": int(r.L), "H": int(H), "noise": float(noise),
                         "side": str(r.side), "metric": metric, "n": int(r.n), "mean": float(r.mean),
                         "ci_low": float(r.ci_low), "ci_high": float(r.ci_high)})
    table = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    rank = {a: i for i, a in enumerate(order)}
    table = table.sort_values(["agent", "side", "noise"], key=lambda c: c.map(rank) if c.name == "agent" else c,
                              kind="stable").reset_index(drop=True)
    return table


def _read_levels(aggregate, levels) -> tuple[dict[float, pd.DataFrame], dict]:
    if len(aggregate) != len(levels):
        raise ValueError(f"give one aggregate table per noise level, in the same order; got {len(levels)} levels "
                         f"and {len(aggregate)} tables")
    levels = [float(x) for x in levels]
    if len(set(levels)) != len(levels):
        raise ValueError(f"noise levels must be distinct, got {levels}")
    tables, meta = {}, {}
    for level, path in zip(levels, aggregate):
        tables[level], meta = read_table(path, "aggregate")
    return tables, meta


def noise_context(summary: pd.DataFrame, *, split: str, H: int) -> dict:
    """Template context of the success-vs-epsilon table."""
    levels = sorted(summary["noise"].unique())
    cells = {(r.agent, r.side, r.noise): r for r in summary.itertuples(index=False)}

    def cell(agent, side, noise):
        r = cells.get((agent, side, noise))
        if r is None:
            return {"mean": None, "low": None, "high": None, "missing": True}
        return {"mean": r.mean, "low": r.ci_low, "high": r.ci_high, "missing": False}

    order = list(dict.fromkeys(summary["agent"]))
    groups = [{"family": g["family"], "reference": g["reference"],
               "rows": [{"name": display_name(a), "n": int(summary[summary["agent"] == a]["n"].max()),
                         "cells": [cell(a, side, x) for side in SPLIT_SIDES for x in levels]} for a in g["agents"]]}
              for g in grouped(order)]
    ns = summary.groupby("agent")["n"].max().tolist()
    return {"split": split, "H": int(H), "L": int(summary["L"].iloc[0]), "levels": [f"{x:g}" for x in levels],
            "sides": [SIDE_LABELS[s] for s in SPLIT_SIDES], "groups": groups, "seeds": _seeds_text(ns),
            "n_columns": 2 + len(SPLIT_SIDES) * len(levels)}


def figure_noise(summary: pd.DataFrame, stem, *, split: str, H: int) -> list[str]:
    """Success vs epsilon, one line per method with its bootstrap CI band; ID and OOD panels sharing y."""
    plt = pyplot()
    agents = list(dict.fromkeys(summary["agent"]))
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH * 2, 2.4), sharey=True)
    for ax, side in zip(axes, SPLIT_SIDES):
        for i, agent in enumerate(agents):
            data = summary[(summary["agent"] == agent) & (summary["side"] == side)].sort_values("noise")
            style = method_style(i)
            x = data["noise"].to_numpy()
            ax.plot(x, data["mean"], color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
                    markersize=3.5, linewidth=1.1, label=display_name(agent))
            ax.fill_between(x, data["ci_low"], data["ci_high"], color=style["color"], alpha=0.15, linewidth=0)
        ax.set_title(f"{SIDE_LABELS[side]} ({'training' if side == 'train' else 'held-out'} rules)")
        ax.set_xlabel(r"cell-update noise $\varepsilon$")
        levels = sorted(summary["noise"].unique())
        ax.set_xticks(levels, labels=[f"{x:g}" for x in levels])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("strict success")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(f"Success vs noise on split {split} ($L={int(summary['L'].iloc[0])}$, $H={H}$)", fontsize=8, y=1.03)
    return save_figure(fig, stem)


def render_noise_table(out, *, aggregate, levels, split, H, agents=None, parquet=None) -> str:
    """The success-vs-epsilon table at `out` (LaTeX), and optionally the summary Parquet."""
    tables, meta = _read_levels(aggregate, levels)
    summary = noise_summary(tables, split=split, H=int(H), agents=list(agents) if agents else None)
    if parquet:
        config = {"split": split, "H": int(H), "levels": sorted(tables)}
        write_parquet(parquet, summary, meta={**provenance(config, None, inputs=[str(p) for p in aggregate]),
                                              "table": "noise_summary"})
    stats = meta.get("config", {})
    return render_table("noise.tex.j2", out, **noise_context(summary, split=split, H=int(H)),
                        ci_percent=f"{100 * float(stats.get('ci', defaults.CI)):g}",
                        n_resamples=stats.get("n_resamples"))


def render_noise_figure(out, *, aggregate, levels, split, H, agents=None) -> list[str]:
    """The success-vs-epsilon figure at `out`.pdf / .png."""
    tables, _ = _read_levels(aggregate, levels)
    summary = noise_summary(tables, split=split, H=int(H), agents=list(agents) if agents else None)
    return figure_noise(summary, out, split=split, H=int(H))

