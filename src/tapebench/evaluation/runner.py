"""Run a policy on a fixed set of evaluation episodes with the batched environment."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import pandas as pd
import torch

from ..envs.batched import BatchedTapeEnv
from .episodes import EpisodeSet
from .records import coerce_episode_frame


class Policy(Protocol):
    """An evaluation policy: greedy actions for a batch of observations (N, L+1) -> (N,) long.

    A stateful policy may also define `begin(num_episodes)`, called once before the first step.
    """

    def __call__(self, obs: torch.Tensor) -> torch.Tensor: ...


def run_episodes(policy: Callable[[torch.Tensor], torch.Tensor], episodes: EpisodeSet, H: int, *,
                 goal=None, success_bonus: float = 1.0, device="cpu", batch_size: int | None = None) -> dict:
    """Play every episode of `episodes` to termination or H steps; returns per-episode arrays."""
    n = len(episodes)
    batch_size = batch_size or n
    parts = []
    for start in range(0, n, batch_size):
        sl = slice(start, min(n, start + batch_size))
        parts.append(_run_batch(policy, episodes.tapes[sl], episodes.rules[sl], H, goal, success_bonus, device))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@torch.no_grad()
def _run_batch(policy, tapes, rules, H, goal, success_bonus, device) -> dict:
    n, L = tapes.shape
    env = BatchedTapeEnv(n, L=L, H=H, rules=sorted(set(rules.tolist())), goal=goal,
                         success_bonus=success_bonus, device=device, autoreset=False)
    obs = env.load(tapes, rules)
    if hasattr(policy, "begin"):
        policy.begin(n)
    active = torch.ones(n, dtype=torch.bool, device=env.device)
    dist_sum = torch.zeros(n, dtype=torch.float64, device=env.device)
    ret = torch.zeros(n, dtype=torch.float64, device=env.device)
    steps = torch.zeros(n, dtype=torch.int64, device=env.device)
    final_dist = env.distance().double()
    for _ in range(H):
        actions = policy(obs)
        obs, reward, terminated, truncated, info = env.step(actions)
        dist = info["dist"].double()
        dist_sum += torch.where(active, dist, 0.0)
        ret += torch.where(active, reward.double(), 0.0)
        steps += active.long()
        final_dist = torch.where(active, dist, final_dist)
        active &= ~(terminated | truncated)
        if not bool(active.any()):
            break
    # after termination the tape sits at the goal: remaining steps contribute distance 0
    return {
        "success": (final_dist == 0).cpu().numpy(),
        "final_dist": final_dist.cpu().numpy(),
        "auc_dist": (dist_sum / H).cpu().numpy(),
        "return": ret.cpu().numpy(),
        "steps": steps.cpu().numpy(),
    }


def episode_frame(results: dict, episodes: EpisodeSet, *, H: int, split: str = "",
                  rule_types: dict[int, str] | None = None) -> pd.DataFrame:
    """Assemble the per-episode record table (schema in `records`)."""
    rule_types = rule_types or {}
    df = pd.DataFrame({
        "split": split,
        "side": episodes.side,
        "rule": episodes.rules,
        "type": [rule_types.get(int(z), "") for z in episodes.rules],
        "episode": episodes.episodes,
        "L": episodes.tapes.shape[1],
        "H": H,
        **{k: results[k] for k in ("success", "final_dist", "auc_dist", "return", "steps")},
    })
    return coerce_episode_frame(df)
