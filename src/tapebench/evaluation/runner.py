"""Run an evaluation policy on a fixed set of evaluation episodes with the batched environment.

The one evaluation path: learned agents, planners, oracles and the random floor all play their
episodes here (contract in `evaluation.policy`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from tapebench import defaults
from tapebench.envs.factory import batched_env
from tapebench.episodes.sets import EpisodeSet
from tapebench.evaluation.records import coerce_episode_frame
from tapebench.methods.contract import EpisodeBatch, as_policy, check_actions
from tapebench.validation import check_goal


def run_episodes(policy, episodes: EpisodeSet, H: int, *, goal=None, success_bonus: float = defaults.SUCCESS_BONUS,
                 device="cpu", batch_size: int | None = None, reveal_rules: bool = False,
                 by_rule: bool = False, who: str = "the evaluation policy") -> dict:
    """Play every episode of `episodes` to termination or H steps; returns per-episode arrays.

    `policy` is an `EvalPolicy` (or a callable obs -> actions). Episodes are played in batches of
    `batch_size` (default: all at once), or one batch per rule with `by_rule`; the policy's `begin`
    is called at the start of each batch. `reveal_rules` passes the true rules to the policy (only
    for reference methods). Results do not depend on the batching for a policy that keeps to the contract.
    With cell-update noise (`episodes.noise` > 0) every step applies the episodes' own noise realisation
    (`EpisodeSet.flips`), so success and reward are judged on the noisy tape, as in the environment.
    Episodes with their own goals (`episodes.goals`, docs/protocol.md#multi-goal) are judged against them and the
    policy sees [s, g, t/H]; `goal` is then the all-zero default.
    """
    policy = as_policy(policy, who)
    n = len(episodes)
    if by_rule:
        batches = [np.flatnonzero(episodes.rules == z) for z in dict.fromkeys(episodes.rules.tolist())]
    else:
        size = batch_size or n
        batches = [np.arange(start, min(n, start + size)) for start in range(0, n, size)]
    goal = check_goal(goal, episodes.tapes.shape[1], family=episodes.family)
    parts = [_run_batch(policy, episodes.subset(rows), H, goal, success_bonus, torch.device(device), reveal_rules,
                        who) for rows in batches]
    order = np.argsort(np.concatenate(batches), kind="stable")
    return {k: np.concatenate([p[k] for p in parts])[order] for k in parts[0]}


@torch.no_grad()
def _run_batch(policy, episodes: EpisodeSet, H, goal, success_bonus, device, reveal_rules, who) -> dict:
    n, L = episodes.tapes.shape
    derived = episodes.goals is not None
    env = batched_env(n, L=L, H=H, rules=sorted(set(episodes.rules.tolist())), family=episodes.family,
                      success_bonus=success_bonus, device=device, autoreset=False, goal=goal, goal_in_obs=derived)
    obs = env.load(episodes.tapes, episodes.rules) if episodes.goals is None else \
        env.load(episodes.tapes, episodes.rules, goals=episodes.goals)
    policy.begin(EpisodeBatch(L=L, H=H, keys=episodes.keys, goal=goal, success_bonus=float(success_bonus),
                              device=env.device, rules=episodes.rules.copy() if reveal_rules else None,
                              family=None if episodes.family.elementary else episodes.family,
                              noise=episodes.noise, goals=episodes.goals.copy() if derived else None))
    active = torch.ones(n, dtype=torch.bool, device=env.device)
    dist_sum = torch.zeros(n, dtype=torch.float64, device=env.device)
    ret = torch.zeros(n, dtype=torch.float64, device=env.device)
    steps = torch.zeros(n, dtype=torch.int64, device=env.device)
    final_dist = env.distance().double()
    for t in range(H):
        actions = check_actions(policy.act(obs), n, who)
        next_obs, reward, terminated, truncated, info = env.step(actions, episodes.flips(t))
        policy.observe(obs, actions, reward, next_obs, terminated, truncated)
        obs = next_obs
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
