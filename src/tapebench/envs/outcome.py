"""The reward contract of every environment (docs/protocol.md#environment), in one place.

After the update the step ends with distance d to the goal at step count t: success is d = 0; the reward is
-d, or the success bonus b on success (r = -d + b·1[d = 0]); the episode terminates on success and is
truncated, without success, at t = H. `step_outcome` is the one-env form (Python scalars), `step_outcomes`
the batched one (tensors; no torch import here, so the one-env path stays free of torch).
"""
from __future__ import annotations


def step_outcome(dist: float, t: int, H: int, success_bonus: float) -> tuple[float, bool, bool]:
    """(reward, terminated, truncated) of one env's step."""
    success = dist == 0.0
    reward = success_bonus if success else -dist
    return float(reward), bool(success), bool((not success) and t >= H)


def step_outcomes(dist, t, H: int, success_bonus: float):
    """(reward, terminated, truncated) of a batch: dist (N,) float32 tensor, t (N,) int64 tensor."""
    reward, terminated = goal_outcomes(dist, success_bonus)
    truncated = (t >= H) & ~terminated
    return reward, terminated, truncated


def goal_distances(tapes, goals):
    """d of a batch: the fraction of cells where tapes (N, L) differ from goals (N, L), float32 (N,) tensor; the
    multi-goal environment's distance (`BatchedTapeEnv` with per-row goals)."""
    return (tapes != goals).sum(dim=-1).float().div_(tapes.shape[-1])


def goal_outcomes(dist, success_bonus: float):
    """(reward, terminated) of a batch at distances dist (N,) float32: r = -d, or the bonus on success (d = 0).
    What hindsight relabelling recomputes for a new goal (`methods.hindsight`): the environment's own reward."""
    terminated = dist == 0
    reward = (-dist).masked_fill_(terminated, success_bonus)
    return reward, terminated
