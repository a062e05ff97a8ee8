"""rliable-style aggregates beside the means (docs/protocol.md#rliable), from the per-rule tables of the main
split at the training horizon: runs are training seeds, tasks are rules (`stats.rliable.score_matrices`),
the score is per-rule strict success (a rate in [0, 1]).

* the table (`results/rliable.tex` + `results/rliable.parquet`): per method and side (ID / OOD) the mean,
  median, IQM and optimality gap (γ = 1) with stratified-bootstrap percentile CIs;
* the probability of improvement (`results/figures/probability_of_improvement` + Parquet): P(row > column)
  on OOD rules for every ordered pair of methods, with CIs;
* the performance profiles (`results/figures/performance_profile`): the run-score distribution — the
  fraction of (seed, rule) scores above τ — vs τ, per method, ID and OOD, with pointwise bootstrap bands.

Statistics settings (resamples, confidence level, seed) come from the config's `statistics` section.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.defaults import CI, N_RESAMPLES
from tapebench.report import style
from tapebench.report.figures import _read_many, method_order
from tapebench.report.render import render_table
from tapebench.report.tables import display_name, grouped
from tapebench.stats import rliable
from tapebench.utils.io import provenance, write_parquet
from tapebench.vocabulary import SPLIT_SIDES

STATISTICS = ("mean", "median", "iqm", "optimality_gap")
STATISTIC_LABELS = {"mean": r"Mean $\uparrow$", "median": r"Median $\uparrow$", "iqm": r"IQM $\uparrow$",
                    "optimality_gap": r"Opt.\ gap $\downarrow$"}     # LaTeX column heads
SUMMARY_COLUMNS = ["split", "H", "agent", "side", "statistic", "point", "ci_low", "ci_high", "n_runs", "n_tasks",
                   "ci", "n_resamples"]
PROFILE_TAUS = np.linspace(0.0, 1.0, 101)


def side_matrices(per_rule: pd.DataFrame, side: str, split=None, H=None, metric: str = "success"
                  ) -> rliable.ScoreMatrices:
    """{agent: (seeds x rules)} on one side, agents in `method_order`."""
    agents = method_order(per_rule.loc[per_rule["side"] == side, "agent"].unique())
    return rliable.score_matrices(per_rule, metric=metric, side=side, split=split, H=H, agents=agents)


def rliable_summary(per_rule: pd.DataFrame, split=None, H=None, n_resamples: int = N_RESAMPLES,
                    ci: float = CI, seed: int = 0) -> pd.DataFrame:
    """One row per (agent, side, statistic): the statistic of the (seeds x rules) matrix with its
    stratified-bootstrap percentile CI (columns SUMMARY_COLUMNS)."""
    rows = []
    for side in SPLIT_SIDES:
        if side not in set(per_rule["side"]):
            continue
        scores = side_matrices(per_rule, side, split, H)
        for statistic in STATISTICS:
            estimates = rliable.stratified_bootstrap_ci(scores, rliable.AGGREGATES[statistic], n_resamples, ci, seed)
            for agent, e in estimates.items():
                rows.append({"split": scores.selection["split"], "H": int(scores.selection["H"]), "agent": agent,
                             "side": side, "statistic": statistic, "point": float(e.point), "ci_low": float(e.low),
                             "ci_high": float(e.high), "n_runs": e.n_runs, "n_tasks": e.n_tasks, "ci": e.ci,
                             "n_resamples": e.n_resamples})
    if not rows:
        raise ValueError(f"per-rule table has no ID / OOD rows (sides present: {sorted(set(per_rule['side']))})")
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def rliable_context(summary: pd.DataFrame) -> dict:
    cells = {(r.agent, r.side, r.statistic): {"point": r.point, "low": r.ci_low, "high": r.ci_high}
             for r in summary.itertuples(index=False)}
    runs = summary.groupby("agent")["n_runs"].max().to_dict()
    tasks = summary.groupby("side")["n_tasks"].max().to_dict()
    order = method_order(summary["agent"].unique())
    groups = [{**g, "rows": [{"name": display_name(a), "n": int(runs[a]),
                              "cells": [cells.get((a, side, s)) for side in SPLIT_SIDES for s in STATISTICS]}
                             for a in g["agents"]]} for g in grouped(order)]
    first = summary.iloc[0]
    return {"groups": groups, "split": first["split"], "H": int(first["H"]), "statistics":
            [STATISTIC_LABELS[s] for s in STATISTICS], "n_id": int(tasks.get("train", 0)),
            "n_ood": int(tasks.get("test", 0)), "ci_percent": f"{100 * float(first['ci']):g}",
            "n_resamples": int(first["n_resamples"])}


def render_rliable(out, *, per_rule, split=None, H=None, n_resamples: int = N_RESAMPLES,
                   ci: float = CI, seed: int = 0, parquet=None) -> str:
    summary = rliable_summary(_read_many(per_rule, "per_rule"), split, H, n_resamples, ci, seed)
    if parquet:
        write_parquet(parquet, summary, meta=provenance(
            {"split": split, "H": H, "metric": "success", "n_resamples": n_resamples, "ci": ci}, seed,
            table="rliable", inputs=[str(p) for p in per_rule]))
    return render_table("rliable.tex.j2", out, **rliable_context(summary))


# --- probability of improvement ------------------------------------------------------------------------------
def improvement_matrix(per_rule: pd.DataFrame, side: str = "test", split=None, H=None,
                       n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0
                       ) -> rliable.ImprovementMatrix:
    return rliable.probability_of_improvement_matrix(side_matrices(per_rule, side, split, H), n_resamples, ci, seed)


def render_probability_of_improvement(out, *, per_rule, split=None, H=None, side: str = "test",
                                      n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0,
                                      parquet=None) -> list[str]:
    if side not in SPLIT_SIDES:
        raise ValueError(f"side must be one of {list(SPLIT_SIDES)} (train = ID, test = OOD), got {side!r}")
    matrix = improvement_matrix(_read_many(per_rule, "per_rule"), side, split, H, n_resamples, ci, seed)
    if parquet:
        frame = matrix.frame()
        frame.insert(0, "side", side)
        write_parquet(parquet, frame, meta=provenance(
            {"split": split, "H": H, "side": side, "metric": "success", "n_resamples": n_resamples, "ci": ci}, seed,
            table="probability_of_improvement", inputs=[str(p) for p in per_rule]))
    plt = style.pyplot()
    k = len(matrix.methods)
    names = [display_name(m) for m in matrix.methods]
    size = min(style.FULL_WIDTH, 1.6 + 0.55 * k)
    fig, ax = plt.subplots(figsize=(size, 0.6 + 0.8 * size))
    shown = np.where(np.eye(k, dtype=bool), np.nan, matrix.point)
    image = ax.imshow(shown, cmap="RdBu", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            if i == j:
                continue
            p, lo, hi = matrix.point[i, j], matrix.low[i, j], matrix.high[i, j]
            colour = "white" if abs(p - 0.5) > 0.3 else "black"
            ax.text(j, i, f"{p:.2f}\n[{lo:.2f}, {hi:.2f}]", ha="center", va="center", fontsize=5, color=colour)
    ax.set_xticks(np.arange(k), names, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_yticks(np.arange(k), names)
    ax.set_xlabel("Y (column)")
    ax.set_ylabel("X (row)")
    ax.set_title(f"P(X > Y): {style.SIDE_LONG_LABELS[side]},\nper-rule strict success, [{100 * ci:g}% CI]")
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label("P(X > Y)")
    fig.tight_layout()
    return style.save_figure(fig, out)


# --- performance profiles -----------------------------------------------------------------------------------
def profiles(per_rule: pd.DataFrame, side: str, split=None, H=None, taus=PROFILE_TAUS,
             n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0) -> dict:
    """{agent: rliable.Profile}: the run-score distribution on one side, with pointwise bands."""
    return rliable.performance_profiles(side_matrices(per_rule, side, split, H), taus, "run", n_resamples, ci, seed)


def render_performance_profile(out, *, per_rule, split=None, H=None, n_resamples: int = N_RESAMPLES,
                               ci: float = CI, seed: int = 0) -> list[str]:
    plt = style.pyplot()
    frame = _read_many(per_rule, "per_rule")
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.7), sharey=True)
    agents = method_order(frame["agent"].unique())
    for ax, side in zip(axes, SPLIT_SIDES):
        for agent, profile in profiles(frame, side, split, H, PROFILE_TAUS, n_resamples, ci, seed).items():
            look = style.method_style(agents.index(agent))
            ax.step(profile.taus, profile.point, where="post", color=look["color"], linestyle=look["linestyle"],
                    linewidth=1.3, label=display_name(agent))
            ax.fill_between(profile.taus, profile.low, profile.high, step="post", color=look["color"], alpha=0.15,
                            linewidth=0)
        ax.set_title(style.SIDE_LONG_LABELS[side])
        ax.set_xlabel(r"threshold $\tau$ (per-rule strict success)")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(r"fraction of (seed, rule) scores $> \tau$")
    axes[0].set_ylim(-0.02, 1.02)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return style.save_figure(fig, out)
