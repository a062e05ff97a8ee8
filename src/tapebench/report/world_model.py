"""World-model credibility outputs (docs/protocol.md#model-error): tables and figures.

* the model-error table: every method with a world model, its ID / OOD success beside its one-step and
  depth-D open-loop prediction error on ID and OOD rules, and the growth from depth 1 to depth D;
* the model-error figure: error vs open-loop depth, ID and OOD, per method, with the bootstrap band;
* the sweep table and figure: one hyperparameter of one method (the paper: the DreamerV3 imagination
  horizon in {5, 10, 15, 20}) against ID / OOD success and one-step error.
"""
from __future__ import annotations

import pandas as pd

from tapebench import defaults
from tapebench.report.render import render_table
from tapebench.report.style import METHOD_COLOURS, SIDE_LABELS, SIDE_LINESTYLES, save_figure
from tapebench.report.tables import display_name
from tapebench.stats.aggregate import aggregate_seeds, read_tables
from tapebench.stats.model_error import ALL_TYPES, growth, value
from tapebench.utils.artifacts import read_table
from tapebench.utils.io import write_parquet
from tapebench.vocabulary import SPLIT_SIDES


def _success(aggregate: pd.DataFrame, agent: str, H: int, side: str) -> dict | None:
    sel = aggregate[(aggregate["agent"] == agent) & (aggregate["H"] == H) & (aggregate["side"] == side)
                    & (aggregate["metric"] == "success")]
    if sel.empty:
        return None
    r = sel.iloc[0]
    return {"mean": float(r["mean"]), "low": float(r["ci_low"]), "high": float(r["ci_high"]), "n": int(r["n"])}


def model_error_context(errors: pd.DataFrame, aggregate: pd.DataFrame | None, *, split: str, H: int,
                        depth: int, context: int | None = None) -> dict:
    agents = list(dict.fromkeys(errors["agent"]))
    max_depth = int(errors["depth"].max())
    if depth > max_depth:
        raise ValueError(f"depth {depth} is beyond the measured depths (1..{max_depth})")
    rows = []
    for agent in agents:
        row = {"name": display_name(agent)}
        for side in SPLIT_SIDES:
            row[f"success_{side}"] = _success(aggregate, agent, H, side) if aggregate is not None else None
            row[f"one_{side}"] = value(errors, agent, side, 1)
            row[f"deep_{side}"] = value(errors, agent, side, depth)
            row[f"growth_{side}"] = growth(errors, agent, side, depth)
        seeds = [c["n"] for c in (row["one_train"], row["one_test"]) if c]
        row["n"] = min(seeds) if seeds else None
        rows.append(row)
    return {"rows": rows, "split": split, "H": H, "depth": depth, "context": context}


def render_model_error(out, *, model_error, aggregate=None, split: str, H: int = defaults.H,
                       depth: int = defaults.MODEL_ERROR_DEPTH, figure=None) -> str:
    """The table from a model-error aggregate (`model_error`) and, for the success columns, the aggregate
    table; with `figure`, also the error-vs-depth figure."""
    errors, meta = read_table(model_error, "model_error_aggregate")
    success = read_table(aggregate, "aggregate")[0] if aggregate else None
    if success is not None:
        success = success[success["split"] == split]
    context = model_error_context(errors, success, split=split, H=H, depth=depth,
                                  context=meta.get("probe", {}).get("context"))
    text = render_table("model_error.tex.j2", out, **context)
    if figure:
        depth_figure(errors, figure, title=f"Open-loop prediction error (split {split})")
    return text


def depth_figure(errors: pd.DataFrame, stem, title: str = "") -> list[str]:
    """Error vs open-loop depth, ID solid and OOD dashed, one colour per method; writes stem.pdf + stem.png."""
    # matplotlib is heavy: only figure builders load it
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib is heavy: only figure builders load it
    import matplotlib.pyplot as plt

    data = errors[errors["type"] == ALL_TYPES]
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for i, agent in enumerate(dict.fromkeys(data["agent"])):
        colour = METHOD_COLOURS[i % len(METHOD_COLOURS)]
        for side in SPLIT_SIDES:
            d = data[(data["agent"] == agent) & (data["side"] == side)].sort_values("depth")
            if d.empty:
                continue
            ax.plot(d["depth"], d["mean"], SIDE_LINESTYLES[side], color=colour, marker="o", markersize=3,
                    label=f"{display_name(agent)} {SIDE_LABELS[side]}")
            ax.fill_between(d["depth"], d["ci_low"], d["ci_high"], color=colour, alpha=0.15, linewidth=0)
    # matplotlib is heavy: only figure builders load it
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("open-loop depth (steps predicted without observations)")
    ax.set_ylabel("fraction of cells predicted wrong")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return save_figure(fig, stem)


def sweep_summary(values: list, per_seed_paths: list, error_paths: list, *, method: str, hyperparameter: str,
                  H: int, n_resamples: int = defaults.N_RESAMPLES, ci: float = defaults.CI,
                  seed: int = 0) -> pd.DataFrame:
    """Per sweep value and side: success (mean, CI over seeds) and one-step error (mean, CI over seeds)."""
    if not (len(values) == len(per_seed_paths) == len(error_paths)):
        raise ValueError(f"a sweep needs one per-seed table and one model-error table per value; got "
                         f"{len(values)} values, {len(per_seed_paths)} per-seed and {len(error_paths)} "
                         f"model-error tables")
    rows = []
    for v, per_seed_path, error_path in zip(values, per_seed_paths, error_paths):
        per_seed = read_tables([per_seed_path], "per-seed")
        per_seed = per_seed[(per_seed["agent"] == method) & (per_seed["H"] == H)]
        if per_seed.empty:
            raise ValueError(f"{per_seed_path} has no values of method {method!r} at H = {H}")
        success = aggregate_seeds(per_seed, n_resamples=n_resamples, ci=ci, seed=seed)
        errors = read_table(error_path, "model_error_aggregate")[0]
        for side in SPLIT_SIDES:
            s = success[(success["side"] == side) & (success["metric"] == "success")].iloc[0]
            e = value(errors, method, side, 1)
            rows.append({"method": method, "hyperparameter": hyperparameter, "value": v, "side": side,
                         "success": float(s["mean"]), "success_low": float(s["ci_low"]),
                         "success_high": float(s["ci_high"]), "n_seeds": int(s["n"]),
                         "one_step_error": e["mean"] if e else float("nan"),
                         "error_low": e["low"] if e else float("nan"), "error_high": e["high"] if e else float("nan")})
    return pd.DataFrame(rows)


def sweep_figure(summary: pd.DataFrame, stem) -> list[str]:
    # matplotlib is heavy: only figure builders load it
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib is heavy: only figure builders load it
    import matplotlib.pyplot as plt

    method, hyper = summary["method"].iloc[0], summary["hyperparameter"].iloc[0]
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0))
    for side, colour in (("train", METHOD_COLOURS[0]), ("test", METHOD_COLOURS[1])):
        d = summary[summary["side"] == side].sort_values("value")
        for ax, col, low, high in ((axes[0], "success", "success_low", "success_high"),
                                   (axes[1], "one_step_error", "error_low", "error_high")):
            ax.errorbar(d["value"], d[col], yerr=[d[col] - d[low], d[high] - d[col]], color=colour, marker="o",
                        linestyle=SIDE_LINESTYLES[side], capsize=3, label=SIDE_LABELS[side])
    axes[0].set_ylabel("strict success")
    axes[1].set_ylabel("one-step prediction error")
    for ax in axes:
        ax.set_xlabel(hyper.replace("_", " "))
        ax.set_xticks(sorted(summary["value"].unique()))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    fig.suptitle(f"{display_name(method)}: sensitivity to {hyper.replace('_', ' ')}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


def render_sweep(out, *, method: str, hyperparameter: str, values, per_seed, model_error, split: str,
                 H: int = defaults.H, n_resamples: int = defaults.N_RESAMPLES, ci: float = defaults.CI, seed: int = 0,
                 parquet=None, figure=None) -> str:
    """The sweep table from one per-seed table and one model-error aggregate per swept value (same order)."""
    summary = sweep_summary(values, per_seed, model_error, method=method, hyperparameter=hyperparameter,
                            H=H, n_resamples=n_resamples, ci=ci, seed=seed)
    if parquet:
        write_parquet(parquet, summary, meta={"table": "sweep", "method": method, "hyperparameter": hyperparameter,
                                              "H": H, "split": split})
    if figure:
        sweep_figure(summary, figure)
    rows = []
    for v in values:
        d = {r.side: r for r in summary[summary["value"] == v].itertuples()}
        rows.append({"value": v, "n": d["train"].n_seeds, "cells": [
            {"mean": d[s].success, "low": d[s].success_low, "high": d[s].success_high} for s in SPLIT_SIDES
        ] + [{"mean": d[s].one_step_error, "low": d[s].error_low, "high": d[s].error_high} for s in SPLIT_SIDES]})
    return render_table("sweep.tex.j2", out, rows=rows, method=display_name(method),
                        hyperparameter=hyperparameter.replace("_", " "), split=split, H=H,
                        ci_percent=f"{100 * ci:g}")
