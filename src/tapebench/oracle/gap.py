"""The budgeted planner's optimality gap: MPC vs the exact optimum on the same episodes.

Both record files must come from the same protocol (same episodes); rows are paired on
(rule, episode). The output has one row per rule, per type and overall (`level` = rule / type / all)
with episode count, both oracles' strict success, final distance, AUC distance and return, the
success gap (exact - MPC) and `exact_worse`: episodes where the exact controller is worse than MPC
(no success where MPC succeeds, or a larger final distance) — 0 by construction.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.evaluation.protocol import protocol_differences, read_records

METRICS = ("success", "final_dist", "auc_dist", "return")
TYPE_ORDER = ("stable", "periodic", "chaotic")


def paired_episodes(mpc_path, exact_path) -> tuple[pd.DataFrame, dict]:
    mpc, mpc_meta = read_records(mpc_path)
    exact, exact_meta = read_records(exact_path)
    diffs = protocol_differences(mpc_meta["protocol"], exact_meta["protocol"])
    if diffs:
        raise ValueError(f"MPC records {mpc_path} and exact records {exact_path} come from different protocols: "
                         + "; ".join(diffs))
    keys = ["rule", "episode"]
    both = mpc.merge(exact, on=keys, suffixes=("_mpc", "_exact"), validate="one_to_one")
    if len(both) != len(mpc) or len(both) != len(exact):
        raise ValueError(f"MPC ({len(mpc)}) and exact ({len(exact)}) records do not pair up on (rule, episode)")
    both["type"] = both["type_mpc"]
    both["exact_worse"] = (both["success_mpc"] & ~both["success_exact"]) | (
        (both["success_mpc"] == both["success_exact"]) & (both["final_dist_exact"] > both["final_dist_mpc"] + 1e-12))
    return both, mpc_meta["protocol"]


def _summary(rows: pd.DataFrame) -> dict:
    out = {"n": int(len(rows))}
    for m in METRICS:
        for who in ("mpc", "exact"):
            out[f"{who}_{m}"] = float(rows[f"{m}_{who}"].astype(float).mean())
    out["success_gap"] = out["exact_success"] - out["mpc_success"]
    out["exact_worse"] = int(rows["exact_worse"].sum())
    return out


def oracle_gap(mpc_path, exact_path) -> tuple[pd.DataFrame, dict]:
    both, protocol = paired_episodes(mpc_path, exact_path)
    rows = []
    for rule, g in both.groupby("rule", sort=True):
        rows.append({"level": "rule", "rule": int(rule), "type": str(g["type"].iloc[0]), **_summary(g)})
    types = [t for t in TYPE_ORDER if t in set(both["type"])] + sorted(set(both["type"]) - set(TYPE_ORDER) - {""})
    for t in types:
        rows.append({"level": "type", "rule": -1, "type": t, **_summary(both[both["type"] == t])})
    rows.append({"level": "all", "rule": -1, "type": "all", **_summary(both)})
    frame = pd.DataFrame(rows)
    frame["rule"] = frame["rule"].astype(np.int64)
    return frame, protocol


def format_gap(frame: pd.DataFrame) -> str:
    """Plain-text side-by-side table for the terminal."""
    lines = [f"{'':>6} {'type':>9} {'n':>5} {'MPC succ':>9} {'exact succ':>10} {'gap':>7} "
             f"{'MPC dist':>9} {'exact dist':>10} {'MPC AUC':>8} {'exact AUC':>9}"]
    for r in frame.itertuples(index=False):
        label = str(r.rule) if r.level == "rule" else r.level
        lines.append(f"{label:>6} {r.type:>9} {r.n:>5} {r.mpc_success:>9.3f} {r.exact_success:>10.3f} "
                     f"{r.success_gap:>7.3f} {r.mpc_final_dist:>9.3f} {r.exact_final_dist:>10.3f} "
                     f"{r.mpc_auc_dist:>8.3f} {r.exact_auc_dist:>9.3f}")
    return "\n".join(lines)
