"""Per-episode record schema shared by agent evaluations and the oracles.

Columns (one row per episode):
  split (str)       split name, or "" for an explicit rule list
  side (str)        "train" (ID), "test" (OOD), "rules" (explicit list), or "d1", "d2", ... (severity-ladder
                    level d: OOD at exact rule-table distance d, docs/protocol.md#severity-ladders)
  rule (int)        the episode's rule 0..255
  type (str)        operational type of the rule: stable / periodic / chaotic ("" if unknown)
  episode (int)     episode index k within the rule (common random numbers, docs/protocol.md#decisions)
  L, H (int)        tape length and horizon of the episode
  success (bool)    strict success: dist = 0 at episode end
  final_dist (float) normalised Hamming distance at episode end
  auc_dist (float)  mean of dist(s_t, g) over t = 1..H; after a success the remaining steps count as 0
  return (float)    undiscounted sum of shaped rewards
  steps (int)       steps taken (<= H)
Evaluations of learned agents add: agent (str), seed (int), checkpoint (int, env steps trained).
"""
from __future__ import annotations

import pandas as pd

from tapebench.schemas import AGENT_COLUMNS, EPISODE_COLUMNS

SOFT_EPSILONS = (0.03125, 0.0625, 0.1)


def coerce_episode_frame(df: pd.DataFrame, with_agent: bool = False) -> pd.DataFrame:
    """Check the columns and dtypes of an episode table; raises naming missing columns."""
    cols = dict(EPISODE_COLUMNS)
    if with_agent:
        cols = {**AGENT_COLUMNS, **cols}
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"episode table lacks columns {missing}; expected {list(cols)}")
    return df[list(cols) + [c for c in df.columns if c not in cols]].astype(cols)


def soft_success(final_dist, eps: float):
    """soft success@eps: final distance <= eps (with a float tolerance of 1e-9)."""
    return final_dist <= eps + 1e-9
