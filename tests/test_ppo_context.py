"""PPO (context): its policy stays shift-equivariant with the context's channels (rolling the tapes of the episode so
far rolls the logits), a cell's channels are what the context says acting on it does, ended episodes add nothing to
the context, per-episode evaluation state, and a resumed training state continues identically."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, tensors_equal

from tapebench.ca import reference
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.methods.contract import EnvSpec, EpisodeBatch
from tapebench.methods.context_model import context_counts
from tapebench.methods.ppo_context import cell_features
from tapebench.registry import build_config, get_method, make_agent

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"num_envs": 4, "num_steps": 8, "num_minibatches": 2, "update_epochs": 1, "conv_channels": 8,
         "conv_layers": 2}


def fresh(L=8, H=8, **overrides):
    torch.manual_seed(0)
    return make_agent("ppo_context", build_config("ppo_context", {**SMALL, **overrides}), EnvSpec.for_tape(L, H),
                      1_000, "cpu")


def run(agent, steps: int, seed: int = 0):
    env = BatchedTapeEnv(agent.config.num_envs, L=8, H=8, rules=[30, 110, 90], seed=seed)
    obs = env.reset(seed=seed)
    for _ in range(steps):
        actions = agent.act(obs)
        following, rewards, terminated, truncated, info = env.step(actions)
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        agent.update()
        obs = following


def test_registered_as_an_equivariant_actor_critic_row():
    method = get_method("ppo_context")
    assert method.trains and method.family == "actor_critic" and method.any_rule_family
    with pytest.raises(ValueError, match="network"):
        build_config("ppo_context", {"network": "mlp"})


def test_rolling_the_episode_so_far_rolls_the_logits():
    agent = fresh()
    L, n = 8, 5
    rng = np.random.default_rng(1)
    tapes = torch.as_tensor(rng.integers(0, 2, (n, 3, L)), dtype=torch.float32)
    actions = torch.as_tensor(rng.integers(0, L, (n, 2)))

    def logits(shift: int) -> torch.Tensor:
        policy = agent.evaluation_policy()
        policy.begin(EpisodeBatch(L=L, H=8, keys=np.arange(n, dtype=np.uint64), goal=np.zeros(L, np.uint8),
                                  success_bonus=1.0, device=torch.device("cpu")))
        obs = [torch.cat([torch.roll(tapes[:, t], shift, 1), torch.full((n, 1), t / 8)], 1) for t in range(3)]
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(2):
            policy.observe(obs[t], (actions[:, t] + shift) % L, None, obs[t + 1], done, done)
        return policy.actor(policy.context.augment(obs[2]))

    base = logits(0)
    assert torch.allclose(logits(3), torch.roll(base, 3, 1), atol=1e-6)
    assert not torch.allclose(base, torch.roll(base, 1, 1), atol=1e-6)


def test_cell_channels_are_what_the_context_says_acting_on_the_cell_does():
    """With every window of rule 30 in the context, cell a's channels are its own next value and the next values of
    cells a-1, a, a+1 after flipping a, each beside a 'shown' flag; with an empty context every channel is 0."""
    L, rule = 8, 30
    post = np.array([0, 0, 0, 1, 0, 1, 1, 1], dtype=np.uint8)               # every 3-cell window once
    counts = context_counts(torch.as_tensor(post).long()[None, None], torch.as_tensor(
        reference.ca_step(post, rule)).long()[None, None], 2, 1)
    tape = np.random.default_rng(0).integers(0, 2, L).astype(np.uint8)
    channels = cell_features(torch.as_tensor(tape).long()[None], counts, 2, 1)[0]   # (8, L)
    assert torch.equal(channels[0::2], torch.ones(4, L))
    assert np.array_equal(channels[1].numpy(), reference.ca_step(tape, rule))
    for a in range(L):
        flipped = tape.copy()
        flipped[a] ^= 1
        after = reference.ca_step(flipped, rule)
        assert [channels[3 + 2 * j, a].item() for j in range(3)] == [after[(a + j - 1) % L] for j in range(3)]
    assert torch.equal(cell_features(torch.as_tensor(tape).long()[None], torch.zeros(1, 8, 2), 2, 1),
                       torch.zeros(1, 8, L))


def test_transitions_of_ended_episodes_add_nothing():
    policy = fresh().evaluation_policy()
    policy.begin(EpisodeBatch(L=8, H=8, keys=np.arange(2, dtype=np.uint64), goal=np.zeros(8, np.uint8),
                              success_bonus=1.0, device=torch.device("cpu")))
    obs = torch.zeros(2, 9)
    ended = torch.tensor([True, False])
    policy.observe(obs, torch.zeros(2, dtype=torch.long), None, obs, ended, torch.zeros(2, dtype=torch.bool))
    policy.observe(obs, torch.zeros(2, dtype=torch.long), None, obs, ended, torch.zeros(2, dtype=torch.bool))
    assert policy.context.counts[0].sum() == 8 and policy.context.counts[1].sum() == 16


def test_evaluation_state_is_per_episode():
    agent = fresh()
    run(agent, 16)
    assert_per_episode_policy(agent.evaluation_policy, L=8, H=8)


def test_a_resumed_training_state_continues_identically():
    first = fresh()
    run(first, 12)
    second = fresh()
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    for agent in (first, second):
        torch.manual_seed(5)
        run(agent, 12, seed=3)
    assert tensors_equal(first.state_dict(), second.state_dict())
