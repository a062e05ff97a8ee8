"""Success by operational rule type (docs/protocol.md#per-type), from the per-rule tables of one split.

Per method, side (ID / OOD) and seed: the strict success of each type is the episode-weighted mean over the
side's rules of that type; "micro" is the episode-weighted mean over all the side's rules; "macro" the mean of
the per-type values of the types present. Each is then averaged over seeds with a percentile-bootstrap CI
over seeds (one resampling of the seeds shared by every column of a method and side). The test split is
type-imbalanced (paper: 22 of 30 test rules chaotic), so micro and macro can differ a lot.

When the MPC and a rule-agnostic row (registry flag `rule_agnostic`) are among the methods, one more row per side,
`HEADROOM_ROW`: the rule-dependent headroom per stratum, the MPC's mean minus the floor's (the rule-agnostic row with
the highest micro mean on that side), CI resampling both seed sets independently
(docs/protocol.md#rule-agnostic-floors).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.report.fixed_z import read_per_rule
from tapebench.report.render import render_table
from tapebench.splits.io import load_split
from tapebench.report.style import TYPE_ORDER, types_present
from tapebench.report.tables import display_name, family_caption
from tapebench.stats.aggregate import group_generator, rule_agnostic_ids
from tapebench.stats.bootstrap import bootstrap_means, percentile_interval, resample_indices
from tapebench.stats.headroom import best_floor, headroom_ci
from tapebench.utils.io import write_parquet
from tapebench.vocabulary import SPLIT_SIDES

MICRO, MACRO = "micro", "macro"
HEADROOM_ROW = "rule_headroom"    # the `agent` of the headroom rows (not a method)
HEADROOM_NAME = "Rule-dependent headroom (MPC minus floor)"


def per_seed_by_type(per_rule: pd.DataFrame, metric: str = "success") -> pd.DataFrame:
    """One row per (agent, side, seed, stratum): value; strata are the types present, micro and macro."""
    data = per_rule[per_rule["metric"] == metric]
    if data.empty:
        raise ValueError(f"the per-rule tables have no metric {metric!r}")
    rows = []
    for (agent, side, seed), grp in data.groupby(["agent", "side", "seed"], sort=True):
        weights = grp["n_episodes"].to_numpy(np.float64)
        values = grp["value"].to_numpy(np.float64)
        by_type = {}
        for t in types_present(grp["type"]):
            mask = (grp["type"] == t).to_numpy()
            by_type[t] = float(np.average(values[mask], weights=weights[mask]))
            rows.append({"agent": agent, "side": side, "seed": int(seed), "stratum": t, "value": by_type[t]})
        rows.append({"agent": agent, "side": side, "seed": int(seed), "stratum": MICRO,
                     "value": float(np.average(values, weights=weights))})
        rows.append({"agent": agent, "side": side, "seed": int(seed), "stratum": MACRO,
                     "value": float(np.mean(list(by_type.values())))})
    return pd.DataFrame(rows)


def type_summary(per_rule: pd.DataFrame, *, n_resamples: int = defaults.N_RESAMPLES, ci: float = defaults.CI,
                 seed: int = 0, metric: str = "success") -> pd.DataFrame:
    """Mean over seeds and bootstrap CI per (agent, side, stratum), with the number of rules per stratum."""
    per_seed = per_seed_by_type(per_rule, metric)
    split = ",".join(sorted(str(s) for s in per_rule["split"].unique()))
    rows = []
    for (agent, side), grp in per_seed.groupby(["agent", "side"], sort=True):
        wide = grp.pivot(index="seed", columns="stratum", values="value").sort_index()
        indices = resample_indices(len(wide), n_resamples, group_generator(seed, (split, agent, side, "types")))
        rules = per_rule[(per_rule["agent"] == agent) & (per_rule["side"] == side) & (per_rule["metric"] == metric)]
        for stratum in wide.columns:
            values = wide[stratum].dropna().to_numpy(np.float64)
            if len(values) != len(wide):
                raise ValueError(f"{agent} {side}: type {stratum!r} is missing for some seeds (rule sets differ)")
            low, high = percentile_interval(bootstrap_means(values, indices=indices), ci)
            n_rules = (rules["rule"].nunique() if stratum in (MICRO, MACRO)
                       else rules.loc[rules["type"] == stratum, "rule"].nunique())
            rows.append({"agent": agent, "side": side, "stratum": stratum, "n_rules": int(n_rules),
                         "n_seeds": int(len(values)), "mean": float(values.mean()), "ci_low": float(low),
                         "ci_high": float(high)})
    summary = pd.DataFrame(rows)
    return pd.concat([summary, headroom_by_type(per_seed, summary, split, n_resamples, ci, seed)], ignore_index=True)


def headroom_by_type(per_seed: pd.DataFrame, summary: pd.DataFrame, split: str, n_resamples: int, ci: float,
                     seed: int) -> pd.DataFrame:
    """The `HEADROOM_ROW` rows per side and stratum (none without the MPC or a rule-agnostic row)."""
    agnostic = set(rule_agnostic_ids())
    rows = []
    for side, grp in per_seed.groupby("side", sort=True):
        micro = grp[grp["stratum"] == MICRO]
        floors = {a: g["value"].to_numpy() for a, g in micro.groupby("agent", sort=True) if a in agnostic}
        if defaults.REFERENCE not in set(grp["agent"]) or not floors:
            continue
        floor = best_floor(floors)
        for stratum in dict.fromkeys(grp.loc[grp["agent"] == defaults.REFERENCE, "stratum"]):
            ref = grp[(grp["agent"] == defaults.REFERENCE) & (grp["stratum"] == stratum)]["value"].to_numpy()
            low_row = grp[(grp["agent"] == floor) & (grp["stratum"] == stratum)]["value"].to_numpy()
            if not len(low_row):
                continue
            iv = headroom_ci(ref, low_row, paired=False, n_resamples=n_resamples, ci=ci,
                             rng=group_generator(seed, (split, HEADROOM_ROW, side, stratum)))
            n_rules = summary[(summary["agent"] == defaults.REFERENCE) & (summary["side"] == side)
                              & (summary["stratum"] == stratum)]["n_rules"].max()
            rows.append({"agent": HEADROOM_ROW, "side": side, "stratum": stratum, "n_rules": int(n_rules),
                         "n_seeds": int(iv.n), "mean": iv.mean, "ci_low": iv.low, "ci_high": iv.high})
    return pd.DataFrame(rows, columns=summary.columns)


def per_type_context(summary: pd.DataFrame, *, split: str, H: int, agents: list[str] | None = None,
                     ci: float = defaults.CI, n_resamples: int = defaults.N_RESAMPLES, family=None,
                     L: int | None = None) -> dict:
    """The template's context; `family` (the split's rule family) and `L` name a family other than the elementary
    one in the caption (`tables.family_caption`)."""
    agents = [a for a in (agents or dict.fromkeys(summary["agent"])) if a != HEADROOM_ROW]
    if HEADROOM_ROW in set(summary["agent"]):
        agents.append(HEADROOM_ROW)
    types = types_present(summary.loc[~summary["stratum"].isin([MICRO, MACRO]), "stratum"])
    columns = [*types, MICRO, MACRO]
    counts = {side: {t: int(summary[(summary["side"] == side) & (summary["stratum"] == t)]["n_rules"].max())
                     if not summary[(summary["side"] == side) & (summary["stratum"] == t)].empty else 0
                     for t in types} for side in SPLIT_SIDES}
    rows = []
    for agent in agents:
        for side in SPLIT_SIDES:
            sel = summary[(summary["agent"] == agent) & (summary["side"] == side)]
            if sel.empty:
                continue
            cells = []
            for col in columns:
                c = sel[sel["stratum"] == col]
                cells.append(None if c.empty else {"mean": float(c["mean"].iloc[0]), "low": float(c["ci_low"].iloc[0]),
                                                   "high": float(c["ci_high"].iloc[0])})
            rows.append({"name": HEADROOM_NAME if agent == HEADROOM_ROW else display_name(agent),
                         "side": "ID" if side == "train" else "OOD",
                         "n": int(sel["n_seeds"].max()), "cells": cells})
    return {"rows": rows, "columns": columns, "counts": counts, "types": types, "split": split, "H": H,
            "headroom": HEADROOM_ROW in agents, **family_caption(family, L),
            "ci_percent": f"{100 * ci:g}", "n_resamples": n_resamples, "known_types": list(TYPE_ORDER)}


def render_per_type(out, *, per_rule, split, H, agents=None, n_resamples=defaults.N_RESAMPLES, ci=defaults.CI, seed=0,
                    parquet=None, split_file=None) -> str:
    """`split_file` (the split JSON) names its rule family in the caption where it is not the elementary one."""
    frame = read_per_rule(per_rule)
    frame = frame[(frame["split"] == split) & (frame["H"] == int(H)) & frame["side"].isin(SPLIT_SIDES)]
    if frame.empty:
        raise ValueError(f"the per-rule tables have no ID / OOD values on split {split!r} at H = {H}")
    summary = type_summary(frame, n_resamples=n_resamples, ci=ci, seed=seed)
    if parquet:
        write_parquet(parquet, summary, meta={"table": "per_type", "split": split, "H": int(H), "ci": ci,
                                              "n_resamples": n_resamples, "seed": seed})
    family = load_split(split_file).family if split_file is not None else None
    context = per_type_context(summary, split=split, H=int(H), agents=list(agents) if agents else None, ci=ci,
                               n_resamples=n_resamples, family=family, L=int(frame["L"].iloc[0]))
    return render_table("table_types.tex.j2", out, **context)
