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
from tapebench.methods.ppo_context import cell_features, feature_channels, lookahead_values, table_probabilities
from tapebench.registry import build_config, get_method, make_agent
from tapebench.rule_family import RuleFamily

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


def pinned_counts(rules, family):
    """(N, E, k) a context that shows every window of each rule once (its next value)."""
    counts = torch.zeros(len(rules), family.neighbourhoods, family.k)
    for n, rule in enumerate(rules):
        for w in range(family.neighbourhoods):
            counts[n, w, (rule // family.k ** w) % family.k] = 1.0
    return counts


def two_step_values(tape, goal, rule, family):
    """Brute force through the reference CA: the reward of acting on a (one rule step), and the best two-step return
    starting with a (nothing after reaching the goal), per cell a."""
    def reward(s):
        return -reference.distance(s, goal) + float(np.array_equal(s, goal))
    L, first, both = len(tape), [], []
    for a in range(L):
        s1 = reference.transition(tape, a, rule, family)
        first.append(reward(s1))
        rest = 0.0 if np.array_equal(s1, goal) else max(
            reward(reference.transition(s1, b, rule, family)) for b in range(L))
        both.append(first[-1] + rest)
    return first, both


@pytest.mark.parametrize("family,rules,L", [(RuleFamily(), list(range(256)), 6),
                                            (RuleFamily(3, 1), [0, 5, 1234567, 7625597484986, 3 ** 27 - 1], 5)])
def test_lookahead_channels_are_the_pinned_rules_one_and_two_step_returns(family, rules, L):
    """With a context that pins the rule, the lookahead channels of cell a are the reward of acting on a and the best
    two-step return that starts with a, on every elementary rule (and a few 3-colour rules), towards random goals."""
    rng = np.random.default_rng(2)
    tapes = rng.integers(0, family.k, (len(rules), L))
    goals = np.where(rng.random((len(rules), L)) < 0.5, 0, rng.integers(0, family.k, (len(rules), L)))
    goals[0] = 0                                          # rule 0 reaches the all-zero goal in one step
    values = lookahead_values(torch.as_tensor(tapes), torch.as_tensor(goals),
                              table_probabilities(pinned_counts(rules, family)), family.r, 2)
    for n, rule in enumerate(rules):
        first, both = two_step_values(tapes[n].astype(np.uint8), goals[n].astype(np.uint8), rule, family)
        assert torch.allclose(values[n], torch.tensor([first, both]), atol=1e-4), rule
    reached = values[:, 0] > 0.5
    assert reached.any() and (~reached).any()            # both branches of the return: goal reached and not


def test_lookahead_channels_roll_with_the_tape_and_goal_and_ignore_the_contexts_order():
    rng = np.random.default_rng(3)
    L, n = 8, 6
    tapes, goals = torch.as_tensor(rng.integers(0, 2, (n, L))), torch.as_tensor(rng.integers(0, 2, (n, L)))
    posts, nexts = torch.as_tensor(rng.integers(0, 2, (n, 3, 1))), torch.as_tensor(rng.integers(0, 2, (n, 3, 1)))
    posts, nexts = posts.expand(n, 3, L).clone(), nexts.expand(n, 3, L).clone()
    posts[:, :, 2:5] = torch.as_tensor(rng.integers(0, 2, (n, 3, 3)))              # a partial table
    table = table_probabilities(context_counts(posts, nexts, 2, 1))
    assert ((table > 0) & (table < 1)).any()                                         # unshown windows: uniform
    values = lookahead_values(tapes, goals, table, 1, 2)
    assert torch.allclose(lookahead_values(tapes.roll(3, 1), goals.roll(3, 1), table, 1, 2), values.roll(3, 2),
                          atol=1e-6)
    reordered = table_probabilities(context_counts(posts.flip(1), nexts.flip(1), 2, 1))
    assert torch.equal(lookahead_values(tapes, goals, reordered, 1, 2), values)
    assert torch.equal(lookahead_values(tapes, goals, table, 1, 1), values[:, :1])


def test_lookahead_is_a_checked_hyperparameter_that_sets_the_channels():
    with pytest.raises(ValueError, match="lookahead must be one of"):
        build_config("ppo_context", {"lookahead": 3})
    with pytest.raises(ValueError, match="lookahead_gain = 32.0 needs lookahead"):
        build_config("ppo_context", {"lookahead": 0})
    for steps in (0, 1, 2):
        agent = fresh(lookahead=steps, lookahead_gain=32.0 if steps else 0.0)
        assert agent.network.actor.trunk.inp.in_channels == 2 + feature_channels(RuleFamily(), steps)
        assert agent.rollout.obs.shape[-1] == 9 + 8 * feature_channels(RuleFamily(), steps)


def test_the_lookahead_gain_adds_the_last_lookahead_value_to_the_logits():
    """With the trunk's head zeroed, the actor's logits are the gain times the last lookahead channel; gain 0 has no
    such path."""
    agent = fresh(lookahead=2, lookahead_gain=5.0)
    actor = agent.network.actor
    torch.nn.init.zeros_(actor.head.weight), torch.nn.init.zeros_(actor.head.bias)
    obs = torch.cat([torch.as_tensor(np.random.default_rng(4).integers(0, 2, (3, 8))).float(), torch.zeros(3, 1)], 1)
    augmented = agent.context.augment(obs, torch.zeros(3, 8, 2))
    channels = augmented[:, 9:].view(3, feature_channels(RuleFamily(), 2), 8)
    with torch.no_grad():
        assert torch.allclose(actor(augmented), 5.0 * channels[:, -1], atol=1e-6)
    assert fresh(lookahead=2, lookahead_gain=0.0).network.actor.gain is None


def test_the_lookahead_is_batched_without_changing_the_channels(monkeypatch):
    from tapebench.methods import ppo_context
    agent = fresh()
    rng = np.random.default_rng(5)
    obs = torch.cat([torch.as_tensor(rng.integers(0, 2, (5, 8))).float(), torch.zeros(5, 1)], 1)
    counts = torch.as_tensor(rng.integers(0, 3, (5, 8, 2))).float()
    whole = agent.context.augment(obs, counts)
    monkeypatch.setattr(ppo_context, "LOOKAHEAD_ENTRIES", 2 * 8 * 8 * 8)      # two rows per batch
    assert torch.allclose(agent.context.augment(obs, counts), whole, atol=1e-6)
