"""Few-shot records (docs/protocol.md#few-shot) -> success vs k per method and side, with CIs over seeds.

Per (agent, side, k): each seed's value is its strict success over its test episodes (every study rule of the side,
`episodes_per_rule` each); the row is the mean of those values over seeds with its percentile-bootstrap CI over
seeds (`stats.bootstrap.percentile_ci`; one seed gives the point as its interval).
"""
from __future__ import annotations

import pandas as pd

from tapebench.defaults import CI, N_RESAMPLES, STATISTICS_SEED
from tapebench.schemas import FEWSHOT_AGGREGATE_COLUMNS, FEWSHOT_COLUMNS
from tapebench.stats.bootstrap import percentile_ci
from tapebench.vocabulary import SPLIT_SIDES

KEYS = ["split", "agent", "adaptation", "L", "H", "side", "shots"]


def fewshot_per_seed(records: pd.DataFrame) -> pd.DataFrame:
    """One row per (agent, side, k, seed): strict success over the seed's test episodes, rules and episodes."""
    missing = sorted(set(FEWSHOT_COLUMNS) - set(records.columns))
    if missing:
        raise ValueError(f"few-shot records lack columns {missing}")
    duplicated = records.duplicated(["agent", "seed", "side", "shots", "rule", "episode"])
    if duplicated.any():
        row = records[duplicated].iloc[0]
        raise ValueError(f"few-shot records hold episode {row['episode']} of rule {row['rule']} (side {row['side']}, "
                         f"k = {row['shots']}) of {row['agent']} seed {row['seed']} twice: an input file given twice?")
    grouped = records.groupby([*KEYS, "seed"], observed=True, sort=True)
    return grouped.agg(value=("success", "mean"), n_rules=("rule", "nunique"), episodes=("success", "size")
                       ).reset_index()


def aggregate_fewshot(records: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, ci: float = CI,
                      seed: int = STATISTICS_SEED) -> pd.DataFrame:
    """The few-shot aggregate (columns `schemas.FEWSHOT_AGGREGATE_COLUMNS`): methods in input order, ID before OOD,
    k ascending."""
    per_seed = fewshot_per_seed(records)
    rows = []
    for key, group in per_seed.groupby(KEYS, observed=True, sort=False):
        interval = percentile_ci(group["value"].to_numpy(), n_resamples, ci, rng=seed)
        rows.append({**dict(zip(KEYS, key)), "n_seeds": interval.n, "n_rules": int(group["n_rules"].max()),
                     "episodes": int(group["episodes"].sum()), "mean": interval.mean, "ci_low": interval.low,
                     "ci_high": interval.high, "ci": float(ci), "n_resamples": int(n_resamples)})
    table = pd.DataFrame(rows, columns=FEWSHOT_AGGREGATE_COLUMNS)
    agents = {a: i for i, a in enumerate(dict.fromkeys(records["agent"].astype(str)))}
    sides = {s: i for i, s in enumerate(SPLIT_SIDES)}
    table = table.sort_values(["agent", "side", "shots"], kind="stable",
                              key=lambda c: c.map(agents) if c.name == "agent" else
                              c.map(sides) if c.name == "side" else c).reset_index(drop=True)
    return table.astype({"L": "int64", "H": "int64", "shots": "int64", "n_seeds": "int64", "n_rules": "int64",
                         "episodes": "int64"})
