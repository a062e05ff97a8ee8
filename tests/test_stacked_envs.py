"""A seed block's environments stepped as one (`envs.batched.StackedEnvs`): every seed's slice of every step is what
its own env stepped alone returns, bit for bit, and its env object keeps the state a one-seed run checkpoints."""
from __future__ import annotations

import pytest
import torch

from tapebench.envs.batched import BatchedTapeEnv, StackedEnvs
from tapebench.training.checkpoint import env_state

SEEDS = (3, 11, 12, 40)


def envs(**kwargs):
    # L = 4 with rules that keep or clear the tape: episodes end in success as well as at t = H
    arguments = dict(num_envs=5, L=4, H=6, rules=[0, 204, 90, 30, 232])
    return [BatchedTapeEnv(seed=seed, **{**arguments, **kwargs}) for seed in SEEDS]


@pytest.mark.parametrize("kwargs", [{}, {"noise": 0.1}, {"noise": (0.0, 0.2), "init_density": (0.2, 0.8)},
                                    {"goal": [1, 0, 1, 1], "success_bonus": 2.0}])
def test_each_seeds_slice_is_its_env_stepped_alone(kwargs):
    alone, together = envs(**kwargs), envs(**kwargs)
    for env in alone + together:
        env.reset()
    stacked = StackedEnvs.of(together)
    assert stacked is not None
    actions = torch.Generator().manual_seed(0)
    successes = truncations = 0
    for _ in range(60):
        chosen = torch.randint(0, 4, (len(SEEDS), 5), generator=actions)
        obs, reward, terminated, truncated, final_obs = stacked.step(chosen)
        successes, truncations = successes + int(terminated.sum()), truncations + int(truncated.sum())
        for k, env in enumerate(alone):
            one_obs, one_reward, one_terminated, one_truncated, info = env.step(chosen[k])
            for mine, theirs in ((obs[k], one_obs), (reward[k], one_reward), (terminated[k], one_terminated),
                                 (truncated[k], one_truncated), (final_obs[k], info["final_obs"])):
                assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert successes > 0 and truncations > 0   # both kinds of auto-reset were exercised
    for one, member in zip(alone, together):   # what a checkpoint of each seed would hold
        a, b = env_state(one), env_state(member)
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_envs_it_does_not_cover_step_one_by_one():
    assert StackedEnvs.of(envs(k=3)) is None                      # a rule family beyond the elementary
    assert StackedEnvs.of(envs(autoreset=False)) is None
    assert StackedEnvs.of(envs(goal_in_obs=True)) is None
    mixed = envs()[:1] + [BatchedTapeEnv(num_envs=5, L=4, H=7, rules=[30], seed=1)]
    assert StackedEnvs.of(mixed) is None                          # a different horizon


def test_bad_actions_are_named():
    stacked = StackedEnvs.of(envs())
    with pytest.raises(ValueError, match=r"shape \(4, 5\)"):
        stacked.step(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"in 0\.\.3, got range 4\.\.4"):
        stacked.step(torch.full((4, 5), 4))
