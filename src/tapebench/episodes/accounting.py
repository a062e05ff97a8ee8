"""Per-episode metric accounting inside numba kernels, identical to `evaluation.runner`.

The batched environment computes dist = mismatches / L and the reward in float32 (reward = -dist,
or the success bonus on success) and the runner sums them in float64; AUC = (sum of dist over the
steps taken) / H, so the steps after a success count 0. The oracles reproduce that arithmetic
exactly so their records can be compared row by row with agent evaluations.
"""
from __future__ import annotations

import numba as nb
import numpy as np

SUCCESS, FINAL_DIST, AUC_DIST, RETURN = 0, 1, 2, 3   # columns of the float64 `metrics` array


@nb.njit(cache=True, inline="always")
def add_step(metrics, i, mismatches, L, bonus32):
    """Account one executed step of episode i whose new tape has `mismatches` wrong cells."""
    dist = np.float64(np.float32(mismatches) / np.float32(L))
    metrics[i, AUC_DIST] += dist
    metrics[i, FINAL_DIST] = dist
    if mismatches == 0:
        metrics[i, RETURN] += np.float64(bonus32)
        metrics[i, SUCCESS] = 1.0
    else:
        metrics[i, RETURN] -= dist


def results_dict(metrics: np.ndarray, steps: np.ndarray, actions: np.ndarray, H: int) -> dict:
    """Kernel outputs -> the dict `evaluation.runner.episode_frame` takes (plus the action log)."""
    return {
        "success": metrics[:, SUCCESS] > 0,
        "final_dist": metrics[:, FINAL_DIST].copy(),
        "auc_dist": metrics[:, AUC_DIST] / H,
        "return": metrics[:, RETURN].copy(),
        "steps": steps.astype(np.int64),
        "actions": actions,
    }
