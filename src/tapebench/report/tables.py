"""Context builders for the paper's result tables (Tables 2, 3, 4) from an aggregate Parquet.

The aggregate table is written by `tapebench aggregate` (schema in `tapebench.stats.aggregate`); the
LaTeX comes from the one renderer (`report.render.render_table`) and the templates
`templates/table{2,3,4}.tex.j2`. Methods are shown by their registry display name, grouped by family in the registry's family order
(learned families first, the reference rows — random policy, true-dynamics MPC, exact optimum — last,
under a rule), and within a family in registry order.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tapebench import defaults
from tapebench.defaults import REFERENCE
from tapebench.grid_rules import GridFamily
from tapebench import reference_sets
from tapebench import registry as methods
from tapebench.report.render import render_table, tex_text
from tapebench.rule_family import ELEMENTARY, family_phrase
from tapebench.rules.features import solved_by_any_action
from tapebench.splits.io import load_split
from tapebench.stats.aggregate import HEADROOM_METRIC, ON_METRIC, SCORE_METRIC
from tapebench.utils.artifacts import read_table
from tapebench.vocabulary import SPLIT_SIDES, ZEROS_GOAL

REFERENCE_FAMILY = "reference"
NOT_LEARNED = ("rule_agnostic", REFERENCE_FAMILY)   # families listed last, under a horizontal line, "(not learned)"


def display_name(agent: str) -> str:
    return methods.display_name(agent)


OTHER_FAMILY = "other"   # ids not in the registry (e.g. a plug-in not installed where the table is rendered)
FAMILY_ORDER = {**{f: label for f, label in methods.FAMILIES.items() if f not in NOT_LEARNED},
                OTHER_FAMILY: "Other", **{f: methods.FAMILIES[f] for f in NOT_LEARNED}}


def family(agent: str) -> str:
    method = methods.registry().get(agent)
    return method.family if method is not None else OTHER_FAMILY


def grouped(order: list[str]) -> list[dict]:
    """Agents grouped by family in the registry's family order (unregistered ids in "Other"); the
    rule-agnostic and reference groups (not learned) last."""
    groups = []
    for fam, label in FAMILY_ORDER.items():
        members = [a for a in order if family(a) == fam]
        if members:
            groups.append({"family": label, "reference": fam in NOT_LEARNED, "agents": members})
    return groups


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


def table_order(agents) -> list[str]:
    """Table 3's row order: by family (FAMILY_ORDER, the not-learned families last), then registry order, then id."""
    rank = {m: i for i, m in enumerate(methods.registry())}
    families = list(FAMILY_ORDER)
    return sorted(agents, key=lambda a: (families.index(family(a)), rank.get(a, len(rank)), a))


def _agents(data: pd.DataFrame, agents: list[str] | None) -> list[str]:
    present = sorted(data["agent"].astype(str).unique())
    if agents is None:
        return table_order(present)
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
    ci = float(data["ci"].iloc[0]) if "ci" in data and len(data) else meta.get("config", {}).get("ci", defaults.CI)
    n_resamples = (int(data["n_resamples"].iloc[0]) if "n_resamples" in data and len(data)
                   else meta.get("config", {}).get("n_resamples"))
    last_k = meta.get("last_k")
    return {"ci_percent": f"{100 * ci:g}", "n_resamples": n_resamples,
            "last_k": last_k if isinstance(last_k, int) else None}


def _groups_of_rows(order: list[str], make_row) -> list[dict]:
    return [{"family": g["family"], "reference": g["reference"], "rows": [make_row(a) for a in g["agents"]]}
            for g in grouped(order)]


def _rows(groups: list[dict]) -> list[dict]:
    return [r for g in groups for r in g["rows"]]


def table3_context(agg: pd.DataFrame, split: str, H: int, L: int | None = None, agents=None,
                   meta: dict | None = None, test_rules: list[int] | None = None,
                   random_per_rule: pd.DataFrame | None = None, rule_family=None, min_headroom: float | None = None,
                   goal: str = ZEROS_GOAL) -> dict:
    """Paper Table 3: n, ID success, OOD success, drop (paired), OOD return, ON(p), the floor-normalised score
    (rule-agnostic floor = 0, reference = 100), each with a CI line; the caption gives the reference's
    rule-dependent headroom ID and OOD (docs/protocol.md#rule-agnostic-floors).

    `test_rules` (the split's OOD rules) adds the caption's floor: how many test rules any action solves under the
    protocol's `goal` (env.goal: zeros or derived);
    `random_per_rule` (the random policy's per-rule table) adds how many the random policy solves.
    `min_headroom`: below this OOD headroom the Score column is left empty and the caption says why (a scale from
    the floor to the reference that narrow multiplies every difference into hundreds of points).
    """
    data = _select(agg, split, [H], L)
    cells = _cells(data)

    def make_row(agent: str) -> dict:
        row = {"agent": agent, "name": display_name(agent),
               "id": _cell(cells, agent, H, "train", "success"),
               "ood": _cell(cells, agent, H, "test", "success"),
               "drop": _cell(cells, agent, H, "drop", "success"),
               "ood_return": _cell(cells, agent, H, "test", "return"),
               "on": _cell(cells, agent, H, "test", ON_METRIC),
               "score": _cell(cells, agent, H, "test", SCORE_METRIC),
               "is_on_reference": agent == REFERENCE}
        ns = [c["n"] for c in (row["id"], row["ood"]) if c["n"] is not None]
        row["n"] = min(ns) if ns else None
        return row

    groups = _groups_of_rows(_agents(data, agents), make_row)
    has_reference = any(r["is_on_reference"] for r in _rows(groups))
    headroom = {side: _cell(cells, REFERENCE, H, side, HEADROOM_METRIC) for side in SPLIT_SIDES}
    headroom = None if headroom["test"]["missing"] else headroom
    narrow = (headroom is not None and min_headroom is not None
              and not headroom["test"]["mean"] >= float(min_headroom))
    L = int(data["L"].iloc[0])
    return {"split": split, "L": L, "H": H, "groups": groups, **family_caption(rule_family, L),
            "on_reference": display_name(REFERENCE) if has_reference else None,
            "headroom": headroom, "score_hidden_below": float(min_headroom) if narrow else None,
            "floor": _floor(test_rules, random_per_rule, split, H, rule_family, goal),
            "seeds": _seeds_text([r["n"] for r in _rows(groups)]), **_statistics(data, meta or {})}


def family_caption(rule_family, L: int) -> dict:
    """A caption's family parts (Tables 2-4, the per-type table): `family`, the rules it reports on in LaTeX
    (`rule_family.family_phrase`; None for the elementary family), and `grid`, whether they are 2D grids (whose
    caption gives the torus instead of L)."""
    phrase = family_phrase(rule_family, L)
    return {"family": None if phrase is None else tex_text(phrase), "grid": isinstance(rule_family, GridFamily)}


def _floor(test_rules, random_per_rule, split: str, H: int, rule_family=None, goal: str = ZEROS_GOAL) -> dict | None:
    """Test rules solved by any action (every action reaches the goal in one step from every tape) and,
    if the random policy's per-rule values are given, test rules it solves in >= 90% of episodes."""
    if test_rules is None:
        return None

    any_action = [z for z in test_rules if solved_by_any_action(z, ELEMENTARY if rule_family is None else rule_family, goal)]
    floor = {"n_test": len(test_rules), "any_action": any_action, "random_threshold": RANDOM_SOLVED,
             "random_solved": None}
    if random_per_rule is not None:
        sel = random_per_rule[(random_per_rule["split"] == split) & (random_per_rule["H"] == H)
                              & (random_per_rule["side"] == "test") & (random_per_rule["metric"] == "success")]
        if not sel.empty:
            per_rule = sel.groupby("rule")["value"].mean()
            floor["random_solved"] = sorted(int(z) for z, v in per_rule.items() if v >= RANDOM_SOLVED)
    return floor


RANDOM_SOLVED = 0.9   # a rule the random policy solves this often is "trivially solved"


def _rank_styles(values: list, higher_is_better: bool, digits: int) -> list[str]:
    """'best' / 'second' / '' per value, comparing values as displayed (ties share a style)."""
    shown = [None if v is None or math.isnan(v) else round(v, digits) for v in values]
    distinct = sorted({v for v in shown if v is not None}, reverse=higher_is_better)
    if len(distinct) < 2:
        return [""] * len(values)
    return ["best" if v == distinct[0] else "second" if v == distinct[1] else "" for v in shown]


def table2_context(agg: pd.DataFrame, split: str, horizons: list[int] | None = None, L: int | None = None,
                   agents=None, meta: dict | None = None, digits: int = 3, rule_family=None) -> dict:
    """Paper Table 2: holdout length, success / final distance for ID and OOD at each evaluation H.
    Best and second best per column are marked among the learned methods (reference rows excluded).
    `rule_family`: the split's, named in the caption where it is not the elementary family."""
    if horizons is None:
        if split not in set(agg["split"].astype(str)):
            raise ValueError(f"split {split!r} is not in the aggregate table; "
                             f"available: {sorted(agg['split'].astype(str).unique())}")
        horizons = sorted(int(h) for h in agg.loc[agg["split"] == split, "H"].unique())
    data = _select(agg, split, list(horizons), L)
    cells = _cells(data)
    order = _agents(data, agents)
    columns = [(side, H, metric) for side in SPLIT_SIDES for H in horizons
               for metric in ("success", "final_dist")]
    grid = {agent: [_cell(cells, agent, H, side, metric) for side, H, metric in columns] for agent in order}
    learned = [a for a in order if family(a) not in NOT_LEARNED]
    for agent in order:
        for c in grid[agent]:
            c["style"] = ""
    for j, (_, _, metric) in enumerate(columns):
        styles = _rank_styles([grid[a][j]["mean"] for a in learned], metric == "success", digits)
        for agent, style in zip(learned, styles):
            grid[agent][j]["style"] = style
    per_side = 2 * len(horizons)
    side_groups = [{"label": label, "start": 2 + i * per_side, "end": 1 + (i + 1) * per_side}
                   for i, label in enumerate(("In-Distribution (ID)", "Out-of-Distribution (OOD)"))]
    horizon_groups = [{"H": H, "start": 2 + 2 * k, "end": 3 + 2 * k}
                      for k, H in enumerate(list(horizons) * 2)]
    groups = _groups_of_rows(order, lambda a: {"agent": a, "name": display_name(a), "cells": grid[a]})
    ns = [c["n"] for a in order for c in grid[a]]
    L = int(data["L"].iloc[0])
    return {"split": split, "L": L, "horizons": list(horizons), "groups": groups, **family_caption(rule_family, L),
            "side_groups": side_groups, "horizon_groups": horizon_groups, "n_columns": 1 + len(columns),
            "digits": digits, "seeds": _seeds_text(ns), **_statistics(data, meta or {})}


def table4_context(agg: pd.DataFrame, split: str, H: int, L: int | None = None, agents=None,
                   meta: dict | None = None, rule_family=None) -> dict:
    """Paper Table 4: final distance, AUC distance, soft success@0.1 (ID / OOD), grouped by architecture family;
    `rule_family`: the split's, named in the caption where it is not the elementary family."""
    data = _select(agg, split, [H], L)
    cells = _cells(data)
    metrics = ("final_dist", "auc_dist", "soft_success@0.1")
    groups = _groups_of_rows(_agents(data, agents), lambda a: {
        "agent": a, "name": display_name(a),
        "cells": [_cell(cells, a, H, side, m) for m in metrics for side in SPLIT_SIDES]})
    ns = [c["n"] for g in groups for r in g["rows"] for c in r["cells"]]
    L = int(data["L"].iloc[0])
    return {"split": split, "L": L, "H": H, "groups": groups, **family_caption(rule_family, L),
            "seeds": _seeds_text(ns), **_statistics(data, meta or {})}


def reference_marks(name: str | None, agents, root=reference_sets.ROOT) -> dict:
    """Table 3's marks of the rows a reference set supplied: {"name", "code", "rows": {agent: mark}} with mark
    "\\dagger" (from the set) or "\\ddagger" (from the set, made by other code than the installed one)."""
    if not name:
        return {}
    manifest = reference_sets.read_manifest(name, root)
    changed = reference_sets.changed_methods(manifest)
    rows = {a: ("\\ddagger" if a in changed else "\\dagger") for a in agents if a in manifest["methods"]}
    versions = sorted({v for a in rows for v in manifest["methods"][a].get("code_version", [])})
    return {"name": name, "code": ", ".join(v.split("+g")[-1][:7] for v in versions), "rows": rows,
            "changed": sorted(a for a in rows if a in changed)}


def render_result_table(table: str, aggregate, out, *, split: str, H=None, L=None, agents=None,
                        split_file=None, random_per_rule=None, min_headroom=None, goal=ZEROS_GOAL,
                        reference_set=None) -> str:
    """Render table2/table3/table4 from an aggregate Parquet to `out`; returns the LaTeX text.

    `split_file` (the split JSON): the captions name its rule family where it is not the elementary one.
    Table 3 only: the split's test rules and `random_per_rule` (the random policy's per-rule Parquet) give the
    caption's floor (`goal`: the protocol's env.goal, which decides the rules any action solves); `min_headroom`
    hides the Score column below that OOD headroom."""
    agg, meta = load_aggregate(aggregate)
    test_rules, rule_family = None, None
    if split_file is not None:
        loaded = load_split(split_file)
        test_rules, rule_family = list(loaded.test), loaded.family
    if table == "table3":
        per_rule = read_table(random_per_rule, "per_rule")[0] if random_per_rule is not None else None
        context = table3_context(agg, split, _single_H(H), L, agents, meta, test_rules, per_rule, rule_family,
                                 min_headroom=min_headroom, goal=goal)
        context["reference"] = reference_marks(reference_set, [r["agent"] for r in _rows(context["groups"])])
    elif table == "table4":
        context = table4_context(agg, split, _single_H(H), L, agents, meta, rule_family=rule_family)
    elif table == "table2":
        context = table2_context(agg, split, None if H is None else list(H), L, agents, meta, rule_family=rule_family)
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


def render_table2(out, *, aggregate, split, H=None, L=None, agents=None, split_file=None) -> str:
    return render_result_table("table2", aggregate, out, split=split, H=H, L=L, agents=agents, split_file=split_file)


def render_table3(out, *, aggregate, split, H=32, L=None, agents=None, split_file=None, random_per_rule=None,
                  min_headroom=None, goal=ZEROS_GOAL, reference_set=None) -> str:
    return render_result_table("table3", aggregate, out, split=split, H=H, L=L, agents=agents, split_file=split_file,
                               random_per_rule=random_per_rule, min_headroom=min_headroom, goal=goal,
                               reference_set=reference_set)


def render_table4(out, *, aggregate, split, H=32, L=None, agents=None, split_file=None) -> str:
    return render_result_table("table4", aggregate, out, split=split, H=H, L=L, agents=agents, split_file=split_file)
