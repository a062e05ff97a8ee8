"""The fixed-z study (paper App. B; docs/protocol.md#fixed-z): Tables 5 and 6.

* Table 5: methods trained on one rule each (no rule randomisation) at L = H = 32, evaluated on that rule:
  strict success, soft success@0.1 and final distance, mean over seeds with a percentile-bootstrap CI.
* Table 6 at L = H = 16: (a) multi-rule, z ~ Unif(training rules) every episode: the true-dynamics MPC and
  the exact optimum (CI over episodes) and the multi-rule runs (last-K, CI over seeds), ID and OOD; (b) per
  representative rule: MPC and exact optimum (fraction of episodes) beside the fixed-z runs (CI over seeds).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.report.render import render_table
from tapebench.report.tables import display_name
from tapebench.stats.aggregate import group_generator
from tapebench.stats.bootstrap import percentile_ci
from tapebench.utils.artifacts import read_table
from tapebench.vocabulary import SPLIT_SIDES

TABLE5_METRICS = ("success", "soft_success@0.1", "final_dist")


def _interval(values, *, n_resamples: int, ci: float, seed: int, key: tuple) -> dict:
    c = percentile_ci(np.asarray(values, dtype=np.float64), n_resamples, ci, rng=group_generator(seed, key))
    return {"mean": c.mean, "low": c.low, "high": c.high, "n": c.n}


def read_per_rule(paths) -> pd.DataFrame:
    frames = [read_table(p, "per_rule")[0] for p in paths]
    if not frames:
        raise ValueError("no per-rule tables given")
    return pd.concat(frames, ignore_index=True)


def rule_types(features_path, rules) -> dict[int, str]:
    frame = read_table(features_path, "features")[0]
    types = dict(zip(frame["rule"].astype(int), frame["type"].astype(str)))
    missing = [z for z in rules if int(z) not in types]
    if missing:
        raise ValueError(f"features file {features_path} has no type for rules {missing}")
    return {int(z): types[int(z)] for z in rules}


def seed_intervals(per_rule: pd.DataFrame, *, n_resamples: int, ci: float, seed: int) -> pd.DataFrame:
    """Mean over seeds and percentile-bootstrap CI per (agent, L, H, side, rule, metric)."""
    rows = []
    for key, grp in per_rule.groupby(["agent", "L", "H", "side", "rule", "metric"], sort=True):
        values = grp.sort_values("seed")["value"].to_numpy(np.float64)
        c = _interval(values, n_resamples=n_resamples, ci=ci, seed=seed, key=key)
        rows.append({**dict(zip(["agent", "L", "H", "side", "rule", "metric"], key)),
                     "n": c["n"], "mean": c["mean"], "ci_low": c["low"], "ci_high": c["high"]})
    return pd.DataFrame(rows)


def _cell(intervals: pd.DataFrame, agent: str, rule: int, metric: str) -> dict | None:
    sel = intervals[(intervals["agent"] == agent) & (intervals["rule"] == rule) & (intervals["metric"] == metric)]
    if sel.empty:
        return None
    r = sel.iloc[0]
    return {"mean": float(r["mean"]), "low": float(r["ci_low"]), "high": float(r["ci_high"]), "n": int(r["n"])}


def _one(frame: pd.DataFrame, column: str, what: str) -> int:
    values = sorted(int(v) for v in frame[column].unique())
    if len(values) != 1:
        raise ValueError(f"{what}: expected one {column}, found {values}")
    return values[0]


def _protocol(per_rule: pd.DataFrame, what: str) -> dict:
    return {"L": _one(per_rule, "L", what), "H": _one(per_rule, "H", what),
            "seeds": int(per_rule["seed"].nunique()), "last_k": int(per_rule["k_used"].max()),
            "episodes": int((per_rule["n_episodes"] / per_rule["k_used"]).max())}


def table5_context(per_rule: pd.DataFrame, types: dict[int, str], *, rules: list[int], agents: list[str],
                   n_resamples: int = defaults.N_RESAMPLES, ci: float = defaults.CI, seed: int = 0) -> dict:
    missing = [(a, z) for a in agents for z in rules
               if per_rule[(per_rule["agent"] == a) & (per_rule["rule"] == z)].empty]
    if missing:
        raise ValueError(f"no per-rule values for (method, rule) {missing}")
    intervals = seed_intervals(per_rule, n_resamples=n_resamples, ci=ci, seed=seed)
    rows = []
    for z in rules:
        for agent in agents:
            cells = [_cell(intervals, agent, z, m) for m in TABLE5_METRICS]
            rows.append({"rule": z, "type": types.get(z, ""), "name": display_name(agent), "n": cells[0]["n"],
                         "cells": cells})
    return {"rows": rows, **_protocol(per_rule, "Table 5"), "ci_percent": f"{100 * ci:g}",
            "n_resamples": n_resamples}


def episode_interval(records: pd.DataFrame, *, n_resamples: int, ci: float, seed: int, key: tuple) -> dict:
    """Strict success over the episodes of a records table, with a percentile-bootstrap CI over episodes."""
    ordered = records.sort_values(["rule", "episode"])
    return _interval(ordered["success"].astype(np.float64), n_resamples=n_resamples, ci=ci, seed=seed, key=key)


def _aggregate_cell(aggregate: pd.DataFrame, agent: str, side: str) -> dict | None:
    sel = aggregate[(aggregate["agent"] == agent) & (aggregate["side"] == side) & (aggregate["metric"] == "success")]
    if sel.empty:
        return None
    r = sel.iloc[0]
    return {"mean": float(r["mean"]), "low": float(r["ci_low"]), "high": float(r["ci_high"]), "n": int(r["n"])}


def table6_context(*, multi_oracle: dict[str, dict[str, pd.DataFrame]], multi_aggregate: pd.DataFrame | None,
                   rule_oracle: dict[str, pd.DataFrame], per_rule: pd.DataFrame, types: dict[int, str],
                   rules: list[int], agents: list[str], multi_agents: list[str],
                   n_resamples: int = defaults.N_RESAMPLES, ci: float = defaults.CI, seed: int = 0) -> dict:
    """multi_oracle: {"mpc"|"exact": {"train"|"test": records}}; rule_oracle: {"mpc"|"exact": records on rules}."""
    multi = []
    for oracle, sides in multi_oracle.items():
        cells = {side: episode_interval(sides[side], n_resamples=n_resamples, ci=ci, seed=seed,
                                        key=("table6", oracle, side)) for side in SPLIT_SIDES}
        multi.append({"name": ORACLE_NAMES[oracle], "unit": "episodes", **cells})
    for agent in multi_agents:
        cells = {side: _aggregate_cell(multi_aggregate, agent, side) for side in SPLIT_SIDES}
        if cells["train"] is None:
            raise ValueError(f"the multi-rule aggregate has no strict success of {agent!r}")
        multi.append({"name": display_name(agent), "unit": "seeds", **cells})
    intervals = seed_intervals(per_rule, n_resamples=n_resamples, ci=ci, seed=seed) if len(per_rule) else None
    rows = []
    for z in rules:
        oracle_cells = {}
        for oracle, records in rule_oracle.items():
            r = records[records["rule"] == z]
            if r.empty:
                raise ValueError(f"the {oracle} records have no episodes of rule {z}")
            oracle_cells[oracle] = {"mean": float(r["success"].mean()), "n": int(len(r))}
        learned = []
        for agent in agents:
            cell = _cell(intervals, agent, z, "success") if intervals is not None else None
            if cell is None:
                raise ValueError(f"no per-rule values of {agent!r} on rule {z}")
            learned.append(cell)
        rows.append({"rule": z, "type": types.get(z, ""), "mpc": oracle_cells.get("mpc"),
                     "exact": oracle_cells.get("exact"), "learned": learned})
    protocol = _protocol(per_rule, "Table 6") if len(per_rule) else {}
    return {"multi": multi, "rows": rows, "agents": [display_name(a) for a in agents], **protocol,
            "has_exact": "exact" in rule_oracle, "ci_percent": f"{100 * ci:g}", "n_resamples": n_resamples,
            "rule_episodes": int(len(rule_oracle["mpc"]) / max(len(rules), 1)) if "mpc" in rule_oracle else None}


ORACLE_NAMES = {"mpc": "True-dynamics MPC", "exact": "Exact optimum"}


def render_table5(out, *, per_rule, features, rules, agents, total_steps=None, n_resamples=defaults.N_RESAMPLES,
                  ci=defaults.CI, seed=0) -> str:
    frame = read_per_rule(per_rule)
    context = table5_context(frame, rule_types(features, rules), rules=list(rules), agents=list(agents),
                             n_resamples=n_resamples, ci=ci, seed=seed)
    return render_table("table5.tex.j2", out, **context, total_steps=total_steps)


def render_table6(out, *, per_rule, features, rules, agents, mpc, exact=None, multi_agents=None,
                  multi_aggregate=None, multi_mpc=None, multi_exact=None, split=None, total_steps=None,
                  n_resamples=defaults.N_RESAMPLES, ci=defaults.CI, seed=0) -> str:
    def records(path):
        return read_table(path, "records")[0]

    def sides(paths):
        if len(paths) != 2:
            raise ValueError(f"give the train-side and the test-side records, in that order; got {list(paths)}")
        return {"train": records(paths[0]), "test": records(paths[1])}

    multi_oracle = {}
    if multi_mpc:
        multi_oracle["mpc"] = sides(multi_mpc)
    if multi_exact:
        multi_oracle["exact"] = sides(multi_exact)
    rule_oracle = {"mpc": records(mpc)}
    if exact:
        rule_oracle["exact"] = records(exact)
    aggregate = read_table(multi_aggregate, "aggregate")[0] if multi_aggregate else None
    multi_agents = list(multi_agents or [])
    if multi_agents and aggregate is None:
        raise ValueError("--multi-agents needs --multi-aggregate")
    context = table6_context(multi_oracle=multi_oracle, multi_aggregate=aggregate, rule_oracle=rule_oracle,
                             per_rule=read_per_rule(per_rule), types=rule_types(features, rules), rules=list(rules),
                             agents=list(agents), multi_agents=multi_agents, n_resamples=n_resamples, ci=ci,
                             seed=seed)
    return render_table("table6.tex.j2", out, **context, split=split, total_steps=total_steps)
