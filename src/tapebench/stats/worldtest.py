"""World-test scores (docs/protocol.md#world-test) -> means over seeds with percentile-bootstrap CIs.

Per (agent, family, task, side, budget): each seed's value is the mean score over its problems; the row is the mean of
those values over seeds with its percentile-bootstrap CI over seeds. `chance` is 1/6 for prediction (the
uniform answer), NaN for the other tasks (their chance level is the measured chance row, `random`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.schemas import WORLDTEST_AGGREGATE_COLUMNS, WORLDTEST_COLUMNS
from tapebench.defaults import CI, N_RESAMPLES
from tapebench.stats.bootstrap import percentile_ci
from tapebench.vocabulary import PREDICTION_CANDIDATES, PREDICTION_TASK, WORLDTEST_TASKS

KEYS = ["agent", "family", "task", "side", "budget"]


def worldtest_per_seed(records: pd.DataFrame) -> pd.DataFrame:
    """One row per (agent, task, side, budget, seed): the mean score and the number of problems."""
    missing = sorted(set(WORLDTEST_COLUMNS) - set(records.columns))
    if missing:
        raise ValueError(f"world-test records lack columns {missing}")
    grouped = records.groupby([*KEYS, "seed"], observed=True, sort=True)["score"]
    return grouped.agg(value="mean", problems="size").reset_index()


def aggregate_worldtest(records: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, ci: float = CI,
                        seed: int = 0) -> pd.DataFrame:
    """The world-test aggregate (columns `schemas.WORLDTEST_AGGREGATE_COLUMNS`), tasks in protocol order."""
    per_seed = worldtest_per_seed(records)
    rows = []
    for (agent, family, task, side, budget), group in per_seed.groupby(KEYS, observed=True, sort=False):
        interval = percentile_ci(group["value"].to_numpy(), n_resamples, ci, rng=seed)
        rows.append({"agent": str(agent), "family": str(family), "task": str(task), "side": str(side), "budget": int(budget),
                     "n_seeds": interval.n, "problems": int(group["problems"].sum()), "mean": interval.mean,
                     "ci_low": interval.low, "ci_high": interval.high, "ci": float(ci), "n_resamples": int(n_resamples),
                     "chance": 1.0 / PREDICTION_CANDIDATES if task == PREDICTION_TASK else np.nan})
    table = pd.DataFrame(rows, columns=WORLDTEST_AGGREGATE_COLUMNS)
    order = {t: i for i, t in enumerate(WORLDTEST_TASKS)}
    agents = {a: i for i, a in enumerate(dict.fromkeys(records["agent"].astype(str)))}
    return table.sort_values(["agent", "family", "task", "side", "budget"], kind="stable",
                             key=lambda c: c.map(agents) if c.name == "agent" else
                             c.map(order) if c.name == "task" else c).reset_index(drop=True)
