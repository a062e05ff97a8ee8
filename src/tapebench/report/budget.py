"""The budget study (docs/protocol.md#budget-study): strict success vs training budget, ID and OOD, per method.

Input: one per-seed table per (method, budget), methods outer and budgets inner (`tapebench aggregate-seed` over the
last K checkpoints of that budget's runs), the run folders in the same order with seeds innermost (their train.json
gives the CPU time), and the main study's per-seed tables of its rule-agnostic rows and the true-dynamics MPC for the
reference lines: the best rule-agnostic row on OOD rules (the floor a learned policy has to beat without the rule)
and the MPC (what knowing the rule buys).
Output: the table (a row per method and budget: success with its bootstrap CI on each side, seeds, CPU-hours of
training), a summary Parquet, and the figure (success vs steps on a log axis, ID and OOD panels).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tapebench import defaults
from tapebench.layout import MANIFEST_FILE
from tapebench.registry import registry as method_registry
from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, SIDE_LABELS, method_style, pyplot, save_figure
from tapebench.report.tables import display_name
from tapebench.stats.aggregate import aggregate_seeds, read_tables
from tapebench.utils.artifacts import read_json
from tapebench.utils.io import provenance, write_parquet
from tapebench.vocabulary import OOD_SIDE, SPLIT_SIDES

SUMMARY_COLUMNS = ["method", "steps", "side", "n", "mean", "ci_low", "ci_high", "cpu_hours"]
REFERENCE_COLUMNS = ["role", "method", "side", "n", "mean", "ci_low", "ci_high"]
FLOOR, PLANNER = "floor", "planner"
HOUR = 3600.0


def _points(methods, budgets, per_seed) -> list[tuple[str, int, str]]:
    methods, budgets = [str(m) for m in methods], [int(b) for b in budgets]
    if len(per_seed) != len(methods) * len(budgets):
        raise ValueError(f"give one per-seed table per method and budget (methods outer, budgets inner): "
                         f"{len(methods)} x {len(budgets)} = {len(methods) * len(budgets)}, got {len(per_seed)}")
    return [(m, b, str(path)) for (m, b), path in zip(((m, b) for m in methods for b in budgets), per_seed)]


def cpu_hours(runs, points: int) -> list[float]:
    """CPU-hours of training per point: the cpu_time_s of each run folder's train.json (a seed block's share per
    seed), `points` equal runs of consecutive folders."""
    if points == 0 or len(runs) % points:
        raise ValueError(f"give the same number of run folders for each of the {points} points; got {len(runs)}")
    per_point = len(runs) // points
    hours = []
    for i in range(points):
        total = 0.0
        for run in runs[i * per_point:(i + 1) * per_point]:
            record = read_json(Path(run) / MANIFEST_FILE, "training manifest", "tapebench train")
            total += float(record.get("cpu_time_s") or record["wall_time_s"])
        hours.append(total / HOUR)
    return hours


def budget_summary(methods, budgets, per_seed, runs, *, H: int, n_resamples: int = defaults.N_RESAMPLES,
                   ci: float = defaults.CI, seed: int = 0) -> pd.DataFrame:
    """One row per (method, budget, side): strict success over seeds with its bootstrap CI, and the point's CPU-hours."""
    points = _points(methods, budgets, per_seed)
    summaries = []
    for method, steps, path in points:
        table = read_tables([path], "per-seed")
        table = table[(table["agent"] == method) & (table["H"] == int(H))]
        if table.empty:
            raise ValueError(f"{path} has no values of method {method!r} at H = {H}")
        summaries.append(aggregate_seeds(table, n_resamples=n_resamples, ci=ci, seed=seed))
    rows = []
    for (method, steps, _), summary, cpu in zip(points, summaries, cpu_hours(list(runs), len(points))):
        for side in SPLIT_SIDES:
            s = summary[(summary["side"] == side) & (summary["metric"] == "success")].iloc[0]
            rows.append({"method": method, "steps": steps, "side": side, "n": int(s["n"]), "mean": float(s["mean"]),
                         "ci_low": float(s["ci_low"]), "ci_high": float(s["ci_high"]), "cpu_hours": cpu})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def reference_lines(summary: pd.DataFrame, *, split: str, H: int) -> pd.DataFrame:
    """The best rule-agnostic row (highest OOD success) and the true-dynamics MPC of a seed summary
    (`stats.aggregate.aggregate_seeds`), on both sides; a role the summary does not hold is left out."""
    rows = summary[(summary["split"] == split) & (summary["H"] == int(H)) & (summary["metric"] == "success")
                   & summary["side"].isin(SPLIT_SIDES)]
    agnostic = [m for m, entry in method_registry().items() if entry.rule_agnostic]
    chosen = []
    ood = rows[rows["agent"].isin(agnostic) & (rows["side"] == OOD_SIDE)]
    if not ood.empty:
        chosen.append((FLOOR, str(ood.sort_values("mean", ascending=False, kind="stable")["agent"].iloc[0])))
    if (rows["agent"] == defaults.REFERENCE).any():
        chosen.append((PLANNER, defaults.REFERENCE))
    out = [{"role": role, "method": method, "side": str(r.side), "n": int(r.n), "mean": float(r.mean),
            "ci_low": float(r.ci_low), "ci_high": float(r.ci_high)}
           for role, method in chosen for r in rows[rows["agent"] == method].itertuples(index=False)]
    return pd.DataFrame(out, columns=REFERENCE_COLUMNS)


def _read(methods, budgets, per_seed, runs, references, split, H, n_resamples, ci, seed):
    summary = budget_summary(methods, budgets, per_seed, runs, H=int(H), n_resamples=int(n_resamples), ci=float(ci),
                             seed=int(seed))
    lines = pd.DataFrame(columns=REFERENCE_COLUMNS)
    if references:
        seeds = aggregate_seeds(read_tables(list(references), "per-seed"), n_resamples=int(n_resamples),
                                ci=float(ci), seed=int(seed))
        lines = reference_lines(seeds, split=split, H=int(H))
    return summary, lines


def _steps_text(steps: int) -> str:
    if steps == 0:
        return "0 (untrained)"
    return f"{steps // 1_000_000}M" if steps % 1_000_000 == 0 else (f"{steps // 1000}k" if steps % 1000 == 0
                                                                     else str(steps))


def budget_context(summary: pd.DataFrame, references: pd.DataFrame) -> dict:
    cells = {(r.method, r.steps, r.side): r for r in summary.itertuples(index=False)}
    rows = []
    for method in dict.fromkeys(summary["method"]):
        for steps in sorted(summary.loc[summary["method"] == method, "steps"].unique()):
            sides = [cells[(method, steps, side)] for side in SPLIT_SIDES]
            rows.append({"name": display_name(method), "steps": _steps_text(int(steps)), "n": sides[0].n,
                         "cpu_hours": sides[0].cpu_hours,
                         "cells": [{"mean": c.mean, "low": c.ci_low, "high": c.ci_high} for c in sides]})
    lines = []
    for role in (FLOOR, PLANNER):
        chosen = references[references["role"] == role]
        if chosen.empty:
            continue
        by_side = {r.side: r for r in chosen.itertuples(index=False)}
        lines.append({"name": display_name(chosen["method"].iloc[0]), "role": role, "n": int(chosen["n"].max()),
                      "cells": [{"mean": by_side[s].mean, "low": by_side[s].ci_low, "high": by_side[s].ci_high}
                                if s in by_side else None for s in SPLIT_SIDES]})
    return {"rows": rows, "references": lines, "sides": [SIDE_LABELS[s] for s in SPLIT_SIDES]}


def figure_budget(summary: pd.DataFrame, references: pd.DataFrame, stem, *, split: str, H: int) -> list[str]:
    """Success vs training steps (the budgets evenly spaced, as on a log axis that also shows 0: untrained), one line
    per method with its CI bars, the floor and the MPC as horizontal bands; ID and OOD panels sharing y."""
    plt = pyplot()
    methods = list(dict.fromkeys(summary["method"]))
    budgets = sorted(int(b) for b in summary["steps"].unique())
    position = {b: i for i, b in enumerate(budgets)}
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH * 2, 2.4), sharey=True)
    for ax, side in zip(axes, SPLIT_SIDES):
        for i, method in enumerate(methods):
            data = summary[(summary["method"] == method) & (summary["side"] == side)].sort_values("steps")
            style = method_style(i)
            x = [position[int(b)] for b in data["steps"]]
            ax.errorbar(x, data["mean"], yerr=[data["mean"] - data["ci_low"], data["ci_high"] - data["mean"]],
                        color=style["color"], linestyle=style["linestyle"], marker=style["marker"], markersize=3.5,
                        linewidth=1.1, capsize=3, label=display_name(method))
        for role, colour in ((FLOOR, "#777777"), (PLANNER, "#000000")):
            line = references[(references["role"] == role) & (references["side"] == side)]
            if line.empty:
                continue
            r = line.iloc[0]
            ax.axhline(r["mean"], color=colour, linestyle=":", linewidth=1.0,
                       label=f"{display_name(r['method'])} ({'floor' if role == FLOOR else 'true rule'})")
            ax.axhspan(r["ci_low"], r["ci_high"], color=colour, alpha=0.12, linewidth=0)
        ax.set_xticks(range(len(budgets)), labels=[_steps_text(b).replace(" ", "\n") for b in budgets])
        ax.set_title(f"{SIDE_LABELS[side]} ({'training' if side == 'train' else 'held-out'} rules)")
        ax.set_xlabel("training steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("strict success")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=7)
    fig.suptitle(f"Success vs training budget on split {split} ($H={H}$)", fontsize=8, y=1.03)
    return save_figure(fig, stem)


def render_budget_table(out, *, methods, budgets, per_seed, runs, split, H, references=(),
                        n_resamples=defaults.N_RESAMPLES, ci=defaults.CI, seed=defaults.STATISTICS_SEED,
                        parquet=None) -> str:
    """The success-vs-budget table at `out` (LaTeX), and optionally the summary Parquet (with the reference lines
    under its metadata)."""
    summary, references = _read(methods, budgets, per_seed, runs, references, split, H, n_resamples, ci, seed)
    if parquet:
        config = {"split": split, "H": int(H), "methods": list(methods), "budgets": [int(b) for b in budgets]}
        write_parquet(parquet, summary, meta={**provenance(config, None, inputs=[str(p) for p in per_seed]),
                                              "table": "budget_summary",
                                              "references": references.to_dict(orient="records")})
    return render_table("budget.tex.j2", out, **budget_context(summary, references), split=split, H=int(H),
                        ci_percent=f"{100 * float(ci):g}")


def render_budget_figure(out, *, methods, budgets, per_seed, runs, split, H, references=(),
                         n_resamples=defaults.N_RESAMPLES, ci=defaults.CI, seed=defaults.STATISTICS_SEED) -> list[str]:
    """The success-vs-budget figure at `out`.pdf / .png."""
    summary, references = _read(methods, budgets, per_seed, runs, references, split, H, n_resamples, ci, seed)
    return figure_budget(summary, references, out, split=split, H=int(H))
