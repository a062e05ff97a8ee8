"""Context builders for the paper's result tables (Tables 2, 3, 4) from an aggregate Parquet.

The aggregate table is written by `tapebench aggregate` (schema in `tapebench.stats.aggregate`); the
LaTeX comes from the one renderer (`report.render.render_table`) and the templates
`templates/table{2,3,4}.tex.j2`. Agents are shown by their display name (`AGENT_DISPLAY`, falling back
to the registry name) and, by default, ordered by display name as in the paper.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..utils.artifacts import read_table
from .render import render_table

AGENT_DISPLAY = {
    "dqn": "DQN",
    "curl_dqn": "DQN + CURL", "dqn_curl": "DQN + CURL", "curl": "DQN + CURL",
    "rad_dqn": "DQN + RAD", "dqn_rad": "DQN + RAD", "rad": "DQN + RAD",
    "pearl_dqn": "PEARL-DQN", "pearl": "PEARL-DQN",
    "rainbow": "Rainbow",
    "ppo": "PPO",
    "ppo_dr": "PPO + DR",
    "rl2_a2c": "RL2-A2C", "rl2": "RL2-A2C",
    "dreamerv3": "DreamerV3", "dreamer": "DreamerV3",
    "planet": "PlaNet", "ensemble_mpc": "Ensemble MPC",
    "bayes_filter": "Bayes filter", "bayes": "Bayes filter",
    "mpc": "True-dynamics MPC", "oracle": "True-dynamics MPC",
    "random": "Random",
}
FAMILIES = ("Value-based baselines", "Actor--critic baselines", "Model-based baselines",
            "Inference baselines", "Other")
AGENT_FAMILY = {
    **{a: FAMILIES[0] for a in ("dqn", "curl_dqn", "dqn_curl", "curl", "rad_dqn", "dqn_rad", "rad",
                                "pearl_dqn", "pearl", "rainbow")},
    **{a: FAMILIES[1] for a in ("ppo", "ppo_dr", "rl2_a2c", "rl2")},
    **{a: FAMILIES[2] for a in ("dreamerv3", "dreamer", "planet", "ensemble_mpc")},
    **{a: FAMILIES[3] for a in ("bayes_filter", "bayes")},
}


def display_name(agent: str) -> str:
    return AGENT_DISPLAY.get(agent, agent)


def family(agent: str) -> str:
    return AGENT_FAMILY.get(agent, FAMILIES[-1])


def load_aggregate(path) -> tuple[pd.DataFrame, dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"aggregate file not found: {path} (written by `tapebench aggregate`)")
    return read_table(path, "aggregate")


def _select(agg: pd.DataFrame, split: str, horizons: list[int], L: int | None) -> pd.DataFrame:
    splits = sorted(agg["split"].astype(str).unique())
    if split not in splits:
        raise ValueError(f"split {split!r} is not in the aggregate table; available: {splits}")
    data = agg[agg["split"] == split]
    lengths = sorted(int(x) for x in data["L"].unique())
    if L is None:
        if len(lengths) > 1:
            raise ValueError(f"split {split!r} has several tape lengths {lengths} in the aggregate; pass --L")
        L = lengths[0]
    elif L not in lengths:
        raise ValueError(f"L = {L} is not in the aggregate for split {split!r}; available: {lengths}")
    data = data[data["L"] == L]
    available = sorted(int(h) for h in data["H"].unique())
    absent = [h for h in horizons if h not in available]
    if absent:
        raise ValueError(f"H = {absent} not in the aggregate for split {split!r}, L = {L}; available: {available}")
    return data[data["H"].isin(horizons)]


def _agents(data: pd.DataFrame, agents: list[str] | None) -> list[str]:
    present = sorted(data["agent"].astype(str).unique())
    if agents is None:
        return sorted(present, key=lambda a: (display_name(a).lower(), a))
    unknown = [a for a in agents if a not in present]
    if unknown:
        raise ValueError(f"agent(s) {unknown} not in the aggregate table; available: {present}")
    return list(agents)


def _cells(data: pd.DataFrame) -> dict:
    return {(r.agent, int(r.H), r.side, r.metric): r for r in data.itertuples(index=False)}


def _cell(cells: dict, agent: str, H: int, side: str, metric: str) -> dict:
    r = cells.get((agent, H, side, metric))
    if r is None:
        return {"mean": None, "low": None, "high": None, "n": None, "missing": True}
    return {"mean": float(r.mean), "low": float(r.ci_low), "high": float(r.ci_high), "n": int(r.n),
            "missing": False}


def _seeds_text(ns: list[int]) -> str:
    ns = [n for n in ns if n is not None]
    if not ns:
        return "0 seeds"
    lo, hi = min(ns), max(ns)
    return f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}--{hi} seeds"


def _statistics(data: pd.DataFrame, meta: dict) -> dict:
    ci = float(data["ci"].iloc[0]) if "ci" in data and len(data) else meta.get("config", {}).get("ci", 0.95)
    n_resamples = (int(data["n_resamples"].iloc[0]) if "n_resamples" in data and len(data)
                   else meta.get("config", {}).get("n_resamples"))
    last_k = meta.get("last_k")
    return {"ci_percent": f"{100 * ci:g}", "n_resamples": n_resamples,
            "last_k": last_k if isinstance(last_k, int) else None}


def table3_context(agg: pd.DataFrame, split: str, H: int, L: int | None = None, agents=None,
                   meta: dict | None = None) -> dict:
    """Paper Table 3: n, ID success, OOD success, drop (paired), OOD return, each with a CI line."""
    data = _select(agg, split, [H], L)
    cells = _cells(data)
    rows = []
    for agent in _agents(data, agents):
        row = {"agent": agent, "name": display_name(agent),
               "id": _cell(cells, agent, H, "train", "success"),
               "ood": _cell(cells, agent, H, "test", "success"),
               "drop": _cell(cells, agent, H, "drop", "success"),
               "ood_return": _cell(cells, agent, H, "test", "return")}
        ns = [c["n"] for c in (row["id"], row["ood"]) if c["n"] is not None]
        row["n"] = min(ns) if ns else None
        rows.append(row)
    return {"split": split, "L": int(data["L"].iloc[0]), "H": H, "rows": rows,
            "seeds": _seeds_text([r["n"] for r in rows]), **_statistics(data, meta or {})}


def _rank_styles(values: list, higher_is_better: bool, digits: int) -> list[str]:
    """'best' / 'second' / '' per value, comparing values as displayed (ties share a style)."""
    shown = [None if v is None or math.isnan(v) else round(v, digits) for v in values]
    distinct = sorted({v for v in shown if v is not None}, reverse=higher_is_better)
    if len(distinct) < 2:
        return [""] * len(values)
    return ["best" if v == distinct[0] else "second" if v == distinct[1] else "" for v in shown]


def table2_context(agg: pd.DataFrame, split: str, horizons: list[int] | None = None, L: int | None = None,
                   agents=None, meta: dict | None = None, digits: int = 3) -> dict:
    """Paper Table 2: holdout length, success / final distance for ID and OOD at each evaluation H."""
    if horizons is None:
        if split not in set(agg["split"].astype(str)):
            raise ValueError(f"split {split!r} is not in the aggregate table; "
                             f"available: {sorted(agg['split'].astype(str).unique())}")
        horizons = sorted(int(h) for h in agg.loc[agg["split"] == split, "H"].unique())
    data = _select(agg, split, list(horizons), L)
    cells = _cells(data)
    order = _agents(data, agents)
    columns = [(side, H, metric) for side in ("train", "test") for H in horizons
               for metric in ("success", "final_dist")]
    grid = {agent: [_cell(cells, agent, H, side, metric) for side, H, metric in columns] for agent in order}
    for j, (_, _, metric) in enumerate(columns):
        styles = _rank_styles([grid[a][j]["mean"] for a in order], metric == "success", digits)
        for agent, style in zip(order, styles):
            grid[agent][j]["style"] = style
    per_side = 2 * len(horizons)
    side_groups = [{"label": label, "start": 2 + i * per_side, "end": 1 + (i + 1) * per_side}
                   for i, label in enumerate(("In-Distribution (ID)", "Out-of-Distribution (OOD)"))]
    horizon_groups = [{"H": H, "start": 2 + 2 * k, "end": 3 + 2 * k}
                      for k, H in enumerate(list(horizons) * 2)]
    rows = [{"agent": a, "name": display_name(a), "cells": grid[a]} for a in order]
    ns = [c["n"] for a in order for c in grid[a]]
    return {"split": split, "L": int(data["L"].iloc[0]), "horizons": list(horizons), "rows": rows,
            "side_groups": side_groups, "horizon_groups": horizon_groups, "n_columns": 1 + len(columns),
            "digits": digits, "seeds": _seeds_text(ns), **_statistics(data, meta or {})}


def table4_context(agg: pd.DataFrame, split: str, H: int, L: int | None = None, agents=None,
                   meta: dict | None = None) -> dict:
    """Paper Table 4: final distance, AUC distance, soft success@0.1 (ID / OOD), grouped by family."""
    data = _select(agg, split, [H], L)
    cells = _cells(data)
    metrics = ("final_dist", "auc_dist", "soft_success@0.1")
    groups = []
    order = _agents(data, agents)
    for fam in FAMILIES:
        members = [a for a in order if family(a) == fam]
        if members:
            groups.append({"family": fam, "rows": [
                {"agent": a, "name": display_name(a),
                 "cells": [_cell(cells, a, H, side, m) for m in metrics for side in ("train", "test")]}
                for a in members]})
    ns = [c["n"] for g in groups for r in g["rows"] for c in r["cells"]]
    return {"split": split, "L": int(data["L"].iloc[0]), "H": H, "groups": groups,
            "seeds": _seeds_text(ns), **_statistics(data, meta or {})}


def render_result_table(table: str, aggregate, out, *, split: str, H=None, L=None, agents=None) -> str:
    """Render table2/table3/table4 from an aggregate Parquet to `out`; returns the LaTeX text."""
    agg, meta = load_aggregate(aggregate)
    if table == "table3":
        context = table3_context(agg, split, _single_H(H), L, agents, meta)
    elif table == "table4":
        context = table4_context(agg, split, _single_H(H), L, agents, meta)
    elif table == "table2":
        context = table2_context(agg, split, None if H is None else list(H), L, agents, meta)
    else:
        raise ValueError(f"unknown table {table!r}; choose one of table2, table3, table4")
    return render_table(f"{table}.tex.j2", out, **context)


def _single_H(H) -> int:
    if H is None:
        return 32
    if isinstance(H, (list, tuple)):
        if len(H) != 1:
            raise ValueError(f"this table takes one horizon --H, got {list(H)}")
        return int(H[0])
    return int(H)


def render_subcommands(sub):
    """The nested subparsers of `tapebench render TABLE ...`, created on first use so that other areas
    can add their own tables: `render_subcommands(sub).add_parser("table1", ...)`."""
    parser = sub.choices.get("render")
    if parser is None:
        parser = sub.add_parser("render", help="render a paper table (LaTeX) from pipeline artifacts",
                                description="Write one of the paper's tables as LaTeX from the pipeline's "
                                            "outputs; `tapebench render TABLE --help` names the inputs.")
        parser.tables = parser.add_subparsers(dest="table", required=True, metavar="TABLE")
    if not hasattr(parser, "tables"):
        raise RuntimeError("a `render` command was registered without report.tables.render_subcommands; "
                           "register render tables through it")
    return parser.tables
