"""The world test's table and figure (docs/protocol.md#world-test), from its aggregate (`tapebench
aggregate-worldtest`): score per method x task x side x interaction budget with bootstrap CIs over seeds."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, SIDE_LABELS, method_style, pyplot, save_figure
from tapebench.report.tables import _seeds_text, display_name
from tapebench.rule_family import family_from_name
from tapebench.utils.artifacts import read_table
from tapebench.validation import check_length
from tapebench.vocabulary import ID_SIDE, OOD_SIDE, PREDICTION_CANDIDATES, PREDICTION_TASK, WORLDTEST_TASKS

TASK_LABELS = {"prediction": "prediction", "planning": "planning (success)", "detection": "change detection"}


def _ordered(aggregate: pd.DataFrame, agents=None) -> tuple[list[str], list[str], list[int]]:
    present = list(dict.fromkeys(aggregate["agent"].astype(str)))
    absent = [a for a in agents or () if a not in present]
    if absent:
        raise ValueError(f"--agents {absent}: not in the world-test aggregate, whose methods are {present}")
    agents = list(agents) if agents else present
    tasks = [t for t in WORLDTEST_TASKS if t in set(aggregate["task"])]
    budgets = sorted(int(b) for b in aggregate["budget"].unique())
    return agents, tasks, budgets


def worldtest_context(aggregate: pd.DataFrame, *, split: str, L: int, agents=None) -> dict:
    """Template context of the world-test table: a block of rows per method, one row per budget."""
    agents, tasks, budgets = _ordered(aggregate, agents)
    cells = {(r.agent, r.task, r.side, int(r.budget)): r for r in aggregate.itertuples(index=False)}

    def cell(agent, task, side, budget):
        r = cells.get((agent, task, side, budget))
        if r is None:
            return {"mean": None, "low": None, "high": None, "missing": True}
        return {"mean": r.mean, "low": r.ci_low, "high": r.ci_high, "missing": False}

    methods = [{"name": display_name(a),
                "rows": [{"budget": b, "cells": [cell(a, t, s, b) for t in tasks for s in (ID_SIDE, OOD_SIDE)]}
                         for b in budgets]} for a in agents]
    families = [family_from_name(f).describe() for f in dict.fromkeys(aggregate["family"].astype(str))]
    return {"split": split, "L": int(L), "family": "; ".join(families), "tasks": [TASK_LABELS[t] for t in tasks], "methods": methods,
            "seeds": _seeds_text(aggregate.groupby("agent")["n_seeds"].max().tolist())}


def figure_worldtest(aggregate: pd.DataFrame, stem, *, split: str, agents=None) -> list[str]:
    """Score vs interaction budget, one panel per task, a line per method (ID solid, OOD dashed) with CI bands."""
    plt = pyplot()
    agents, tasks, budgets = _ordered(aggregate, agents)
    positions = np.arange(len(budgets))
    fig, axes = plt.subplots(1, len(tasks), figsize=(COLUMN_WIDTH * 2, 2.5), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, agent in enumerate(agents):
            style = method_style(i)
            for side, linestyle in ((ID_SIDE, "-"), (OOD_SIDE, "--")):
                data = aggregate[(aggregate["agent"] == agent) & (aggregate["task"] == task)
                                 & (aggregate["side"] == side)].set_index("budget").reindex(budgets)
                ax.plot(positions, data["mean"], color=style["color"], linestyle=linestyle, marker=style["marker"],
                        markersize=3, linewidth=1.0,
                        label=f"{display_name(agent)}" if side == ID_SIDE else None)
                ax.fill_between(positions, data["ci_low"], data["ci_high"], color=style["color"], alpha=0.12,
                                linewidth=0)
        if task == PREDICTION_TASK:
            ax.axhline(1 / PREDICTION_CANDIDATES, color="0.4", linewidth=0.8, linestyle=":", label="chance (1/6)")
        ax.set_title(TASK_LABELS[task])
        ax.set_xticks(positions, labels=[str(b) for b in budgets])
        ax.set_xlabel("interaction budget $B$ (steps)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("score")
    axes[0][0].set_ylim(-0.02, 1.02)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [plt.Line2D([], [], color="0.3", linestyle=ls) for ls in ("-", "--")]
    labels += [f"{SIDE_LABELS[ID_SIDE]} (solid)", f"{SIDE_LABELS[OOD_SIDE]} (dashed)"]
    axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=6)
    fig.suptitle(f"World test on split {split}: score vs reward-free interaction", fontsize=8, y=1.03)
    return save_figure(fig, stem)


def render_worldtest_table(out, *, aggregate, split, L, agents=None) -> str:
    """The world-test table at `out` (LaTeX)."""
    L = check_length(L)
    table, _ = read_table(aggregate, "worldtest_aggregate")
    ci = float(table["ci"].iloc[0]) if len(table) else defaults.CI
    n_resamples = int(table["n_resamples"].iloc[0]) if len(table) else None
    return render_table("worldtest.tex.j2", out, **worldtest_context(table, split=split, L=int(L), agents=agents),
                        ci_percent=f"{100 * ci:g}", n_resamples=n_resamples)


def render_worldtest_figure(out, *, aggregate, split, agents=None) -> list[str]:
    """The score-vs-budget figure at `out`.pdf / .png."""
    table, _ = read_table(aggregate, "worldtest_aggregate")
    return figure_worldtest(table, out, split=split, agents=agents)
