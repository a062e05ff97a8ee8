"""Exact feasibility per rule (docs/protocol.md#oracle): which non-goal tapes can reach the goal within H steps.

Computed by the exact dynamic programme of `oracle.exact` over all 2^L tapes (L <= 20). Columns:

  rule, L, H
  solvable_fraction   fraction of the 2^L - 1 non-goal tapes from which strict success is reachable
                      within H steps (= the exact controller's expected success from a uniform start)
  solvable_tapes      their number
  any_solvable        at least one non-goal tape is solvable ("rule-wise" solvability)
  min_steps_mean      mean minimal number of steps to the goal over solvable tapes (NaN if none)
  min_steps_max       largest minimal number of steps over solvable tapes (0 if none)
  optimal_final_dist_mean   mean over non-goal tapes of the least reachable final distance after H
                      steps (0 for solvable tapes): the exact optimum's expected final distance
  steps_k (k = 1..H)  fraction of non-goal tapes whose minimal number of steps is exactly k
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.methods.exact import check_exact_horizon, check_exact_length, feasibility_arrays
from tapebench.validation import check_goal, check_rules


def feasibility_table(rules, L: int, H: int, goal=None) -> pd.DataFrame:
    rules = check_rules(rules)
    L, H = check_exact_length(L), check_exact_horizon(H)
    check_goal(goal, L)
    hist, final_sum = feasibility_arrays(rules, L, H, goal)
    nongoal = (1 << L) - 1
    solvable = hist[:, 1:H + 1].sum(axis=1)
    ks = np.arange(1, H + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_steps = np.where(solvable > 0, (hist[:, 1:H + 1] * ks).sum(axis=1) / np.maximum(solvable, 1), np.nan)
    max_steps = np.array([ks[row > 0].max() if row.any() else 0 for row in hist[:, 1:H + 1]])
    frame = pd.DataFrame({
        "rule": np.asarray(rules, dtype=np.int64),
        "L": L, "H": H,
        "solvable_fraction": solvable / nongoal,
        "solvable_tapes": solvable.astype(np.int64),
        "any_solvable": solvable > 0,
        "min_steps_mean": mean_steps,
        "min_steps_max": max_steps.astype(np.int64),
        "optimal_final_dist_mean": final_sum / (nongoal * L),
    })
    for k in ks:
        frame[f"steps_{k}"] = hist[:, k] / nongoal
    return frame


def feasibility_summary(frame: pd.DataFrame) -> dict:
    """Rule-wise and tape-wise solvability over the rules of a feasibility table."""
    return {
        "rules": int(len(frame)),
        "L": int(frame["L"].iloc[0]), "H": int(frame["H"].iloc[0]),
        "rulewise_solvable": float(frame["any_solvable"].mean()),
        "rules_with_solvable_tape": int(frame["any_solvable"].sum()),
        "rules_fully_solvable": int((frame["solvable_tapes"] == (1 << int(frame["L"].iloc[0])) - 1).sum()),
        "mean_solvable_fraction": float(frame["solvable_fraction"].mean()),
        "median_solvable_fraction": float(frame["solvable_fraction"].median()),
        "mean_optimal_final_dist": float(frame["optimal_final_dist_mean"].mean()),
    }
