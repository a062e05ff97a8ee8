"""World-model prediction error over seeds (docs/protocol.md#model-error).

Input: the per-run tables of `tapebench model-error` (agent, seed, checkpoint, side, rule, type, depth,
error, n). A seed's value at (side, depth) is its episode-weighted mean error over the side's rules
(optionally within one rule type); the table reports the mean over seeds with a percentile bootstrap CI
over seeds, like every other value. Rows with type "all" pool the rule types.
"""
from __future__ import annotations

import pandas as pd

from tapebench.schemas import MODEL_ERROR_COLUMNS, MODEL_ERROR_RUN_COLUMNS
from tapebench.stats.aggregate import group_generator
from tapebench.defaults import CI, N_RESAMPLES
from tapebench.stats.bootstrap import percentile_ci
from tapebench.utils.artifacts import read_tables
from tapebench.utils.io import provenance, write_parquet

ALL_TYPES = "all"


def per_seed_errors(table: pd.DataFrame) -> pd.DataFrame:
    """(agent, seed, side, type, depth) -> episode-weighted mean error; type 'all' pools the types."""
    missing = sorted(set(MODEL_ERROR_RUN_COLUMNS) - set(table.columns))
    if missing:
        raise ValueError(f"model-error table lacks columns {missing} (written by `tapebench model-error`)")
    weighted = table.assign(total=table["error"] * table["n"])
    pooled = weighted.assign(type=ALL_TYPES)
    both = pd.concat([pooled, weighted], ignore_index=True)
    out = both.groupby(["agent", "seed", "side", "type", "depth"], sort=True)[["total", "n"]].sum().reset_index()
    out = out[out["n"] > 0]
    out["error"] = out["total"] / out["n"]
    return out.drop(columns="total").rename(columns={"n": "episodes"})


def aggregate_errors(table: pd.DataFrame, n_resamples: int = N_RESAMPLES, ci: float = CI,
                     seed: int = 0) -> pd.DataFrame:
    """Mean over seeds and bootstrap CI per (agent, side, type, depth)."""
    rows = []
    for key, group in per_seed_errors(table).groupby(["agent", "side", "type", "depth"], sort=True):
        interval = percentile_ci(group["error"].to_numpy(), n_resamples, ci, group_generator(seed, key))
        rows.append({"agent": key[0], "side": key[1], "type": key[2], "depth": int(key[3]),
                     "mean": interval.mean, "ci_low": interval.low, "ci_high": interval.high,
                     "n_seeds": interval.n, "episodes": int(group["episodes"].sum())})
    out = pd.DataFrame(rows, columns=MODEL_ERROR_COLUMNS)
    return out.astype({"depth": "int64", "n_seeds": "int64", "episodes": "int64"})


def value(aggregate: pd.DataFrame, agent: str, side: str, depth: int, type: str = ALL_TYPES) -> dict | None:
    """{mean, low, high, n} of one cell, or None if the table has no such row."""
    sel = aggregate[(aggregate["agent"] == agent) & (aggregate["side"] == side) & (aggregate["depth"] == depth)
                    & (aggregate["type"] == type)]
    if sel.empty:
        return None
    row = sel.iloc[0]
    return {"mean": float(row["mean"]), "low": float(row["ci_low"]), "high": float(row["ci_high"]),
            "n": int(row["n_seeds"])}


def growth(aggregate: pd.DataFrame, agent: str, side: str, depth: int) -> float:
    """Error at `depth` over the one-step error (how much open-loop prediction compounds)."""
    one, deep = value(aggregate, agent, side, 1), value(aggregate, agent, side, depth)
    if one is None or deep is None or one["mean"] == 0:
        return float("nan")
    return deep["mean"] / one["mean"]


def aggregate_model_error_files(paths, out, *, n_resamples: int, ci: float, seed: int) -> pd.DataFrame:
    frames, probes = [], []
    for frame, meta in read_tables(paths, "model_error", "model-error"):
        frames.append(frame)
        probes.append({k: meta.get("model_error", {}).get(k) for k in ("context", "depth", "H")})
    if any(p != probes[0] for p in probes):
        raise ValueError(f"model-error tables measured with different probes cannot be pooled: {probes}")
    table = aggregate_errors(pd.concat(frames, ignore_index=True), n_resamples, ci, seed)
    meta = provenance({"n_resamples": n_resamples, "ci": ci, "seed": seed}, seed, probe=probes[0],
                      inputs=[str(p) for p in paths])
    write_parquet(out, table, meta={**meta, "table": "model_error_aggregate"})
    return table


__all__ = ["ALL_TYPES", "aggregate_errors", "growth", "per_seed_errors", "value", "aggregate_model_error_files"]
