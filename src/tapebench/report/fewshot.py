"""The few-shot study's table and figure (docs/protocol.md#few-shot), from its aggregate (`tapebench
aggregate-fewshot`): strict success on a rule's fresh episodes after k reward-bearing episodes of it, per method and
side, with bootstrap CIs over seeds."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, SIDE_LABELS, method_style, pyplot, save_figure
from tapebench.report.tables import _seeds_text, display_name
from tapebench.utils.artifacts import read_table
from tapebench.vocabulary import ID_SIDE, OOD_SIDE

ADAPTATION_LABELS = {"gradient": "gradient steps", "context": "in context", "none": "does not adapt"}


def _ordered(aggregate: pd.DataFrame, agents=None) -> tuple[list[str], list[int]]:
    present = list(dict.fromkeys(aggregate["agent"].astype(str)))
    absent = [a for a in agents or () if a not in present]
    if absent:
        raise ValueError(f"--agents {absent}: not in the few-shot aggregate, whose methods are {present}")
    return (list(agents) if agents else present), sorted(int(k) for k in aggregate["shots"].unique())


def fewshot_context(aggregate: pd.DataFrame, *, split: str, agents=None) -> dict:
    """Template context of the few-shot table: a row per method and side, a column per k."""
    agents, shots = _ordered(aggregate, agents)
    cells = {(r.agent, r.side, int(r.shots)): r for r in aggregate.itertuples(index=False)}

    def cell(agent, side, k):
        r = cells.get((agent, side, k))
        if r is None:
            return {"mean": None, "low": None, "high": None, "missing": True}
        return {"mean": r.mean, "low": r.ci_low, "high": r.ci_high, "missing": False}

    methods = []
    for agent in agents:
        rows = aggregate[aggregate["agent"] == agent]
        methods.append({"name": display_name(agent), "adaptation": ADAPTATION_LABELS[str(rows["adaptation"].iloc[0])],
                        "sides": [{"label": SIDE_LABELS[side], "cells": [cell(agent, side, k) for k in shots]}
                                  for side in (ID_SIDE, OOD_SIDE) if side in set(rows["side"])]})
    rules = {SIDE_LABELS[s]: int(aggregate.loc[aggregate["side"] == s, "n_rules"].max())
             for s in (ID_SIDE, OOD_SIDE) if s in set(aggregate["side"])}
    first = aggregate.iloc[0]
    return {"split": split, "L": int(first["L"]), "H": int(first["H"]), "shots": shots, "methods": methods,
            "rules": rules, "seeds": _seeds_text(aggregate.groupby("agent")["n_seeds"].max().tolist())}


def figure_fewshot(aggregate: pd.DataFrame, stem, *, split: str, agents=None) -> list[str]:
    """Strict success vs k, a line per method (ID solid, OOD dashed) with CI bands; k on an evenly spaced axis."""
    plt = pyplot()
    agents, shots = _ordered(aggregate, agents)
    positions = np.arange(len(shots))
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 2.4))
    for i, agent in enumerate(agents):
        style = method_style(i)
        for side, linestyle in ((ID_SIDE, "-"), (OOD_SIDE, "--")):
            data = aggregate[(aggregate["agent"] == agent) & (aggregate["side"] == side)].set_index("shots")
            if data.empty:
                continue
            data = data.reindex(shots)
            ax.plot(positions, data["mean"], color=style["color"], linestyle=linestyle, marker=style["marker"],
                    markersize=3, linewidth=1.0, label=display_name(agent) if side == ID_SIDE else None)
            ax.fill_between(positions, data["ci_low"], data["ci_high"], color=style["color"], alpha=0.12,
                            linewidth=0)
    ax.set_xticks(positions, labels=[str(k) for k in shots])
    ax.set_xlabel("$k$: reward-bearing episodes of the rule before the test")
    ax.set_ylabel("strict success")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.set_title(f"Few-shot adaptation (split {split}): success vs $k$")
    handles, labels = ax.get_legend_handles_labels()
    handles += [plt.Line2D([], [], color="0.3", linestyle=ls) for ls in ("-", "--")]
    labels += [f"{SIDE_LABELS[ID_SIDE]} (solid)", f"{SIDE_LABELS[OOD_SIDE]} (dashed)"]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=6)
    return save_figure(fig, stem)


def render_fewshot(out, *, aggregate, split, agents=None, table=None) -> list[str]:
    """The success-vs-k figure at `out`.pdf / .png, and optionally the table (LaTeX) at `table`."""
    frame, _ = read_table(aggregate, "fewshot_aggregate")
    if frame.empty:
        raise ValueError(f"{aggregate} holds no few-shot rows")
    paths = figure_fewshot(frame, out, split=split, agents=agents)
    if table:
        ci = float(frame["ci"].iloc[0]) if len(frame) else defaults.CI
        render_table("fewshot.tex.j2", table, **fewshot_context(frame, split=split, agents=agents),
                     ci_percent=f"{100 * ci:g}", n_resamples=int(frame["n_resamples"].iloc[0]))
    return paths
