"""PEARL-DQN: the shared contract (learning, SIGKILL resume, per-episode evaluation state) and the
method's own mechanics: product of Gaussians, empty context = prior, per-row training contexts cleared
exactly on auto-reset, replay contexts = the transitions before the sampled one in its episode, and the
evaluation policy conditioning on exactly the episode's transitions so far."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.runner import run_episodes
from tapebench.methods import pearl_dqn
from tapebench.methods.contract import EnvSpec
from tapebench.methods.pearl_dqn import posterior_from_sums, product_of_gaussians, transition_features
from tapebench.registry import build_config, get_method, make_agent
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train

SMALL = {"num_envs": 4, "hidden_size": 32, "encoder_hidden_size": 16, "learning_starts": 200,
         "target_update_frequency": 200, "batch_size": 32}


def small_agent(L=8, H=8, total_steps=10_000, **overrides):
    torch.manual_seed(0)
    return make_agent("pearl_dqn", build_config("pearl_dqn", {**SMALL, **overrides}), EnvSpec.for_tape(L, H),
                      total_steps, "cpu")


def drive(agent, env, steps, on_step=None):
    """Run the agent in `env` as the training loop does; `on_step(obs, actions, rewards, final_obs,
    terminated, truncated, ids, lengths)` sees each step with the episode ids / context lengths the
    agent had before observing it."""
    obs = env.observation()
    for _ in range(steps):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        ids, lengths = agent.episode_ids.clone(), agent.context_length.clone()
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        agent.update()
        if on_step is not None:
            on_step(obs, actions, rewards, info["final_obs"], terminated, truncated, ids, lengths)
        obs = next_obs



pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --- registry and config -------------------------------------------------------------------------
def test_registered_as_task_inference():
    method = get_method("pearl_dqn")
    assert method.trains and method.family == "task_inference" and method.display_name == "PEARL-DQN"
    assert build_config("pearl_dqn", {}).kl_weight == 0.1 and build_config("pearl_dqn", {}).latent_dim == 8


@pytest.mark.parametrize("overrides,needle", [
    ({"latent_dim": 0}, "latent_dim must be >= 1"),
    ({"kl_weight": -1.0}, "kl_weight must be >= 0"),
    ({"batch_size": 30, "transitions_per_episode": 4}, "batch_size .* multiple of transitions_per_episode"),
    ({"gamma": 1.5}, r"gamma must be in \[0, 1\]"),
])
def test_config_rejects_bad_values(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config("pearl_dqn", overrides)


# --- product of Gaussians ------------------------------------------------------------------------
def test_product_of_two_gaussians_matches_the_closed_form():
    mu = torch.tensor([[0.5, -2.0], [1.5, 3.0]], dtype=torch.float64)
    precision = torch.tensor([[2.0, 0.25], [4.0, 1.0]], dtype=torch.float64)
    mean, variance = product_of_gaussians(mu, precision, torch.tensor([0, 0]), 1)
    total = 1.0 + precision[0] + precision[1]                     # prior N(0, 1) has precision 1
    assert torch.allclose(variance[0], 1.0 / total)
    assert torch.allclose(mean[0], (mu[0] * precision[0] + mu[1] * precision[1]) / total)
    # and it is the normalised product of the three densities: log N(0,1) + log N(μ1) + log N(μ2)
    # - log N(mean, variance) does not depend on x
    x = torch.linspace(-3.0, 3.0, 7, dtype=torch.float64).unsqueeze(1)

    def log_normal(m, v):
        return -0.5 * (x - m) ** 2 / v - 0.5 * torch.log(2 * math.pi * v)

    one = torch.ones((), dtype=torch.float64)
    gap = (log_normal(0.0 * one, one) + log_normal(mu[0], 1 / precision[0]) + log_normal(mu[1], 1 / precision[1])
           - log_normal(mean[0], variance[0]))
    assert torch.allclose(gap, gap[0].expand_as(gap))


def test_posterior_is_invariant_to_permuting_the_transitions():
    agent = small_agent()
    net = agent.network
    gen = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 2, (6, 9), generator=gen).float()
    next_obs = torch.randint(0, 2, (6, 9), generator=gen).float()
    actions = torch.randint(0, 8, (6,), generator=gen)
    rewards = -torch.rand(6, generator=gen)
    features = transition_features(obs, actions, rewards, next_obs, 8)
    context = torch.zeros(6, dtype=torch.long)
    mean, variance = net.posterior(features, context, 1)
    for perm in (torch.tensor([5, 4, 3, 2, 1, 0]), torch.tensor([2, 0, 5, 1, 4, 3])):
        pmean, pvar = net.posterior(features[perm], context, 1)
        assert torch.allclose(mean, pmean, atol=1e-6) and torch.allclose(variance, pvar, atol=1e-7)
    # a context that sees fewer transitions differs, so the comparison above can fail
    assert not torch.allclose(mean, net.posterior(features[:5], context[:5], 1)[0], atol=1e-4)


def test_empty_context_is_exactly_the_prior():
    mu, precision = torch.randn(3, 8), torch.rand(3, 8) + 0.5
    mean, variance = product_of_gaussians(mu, precision, torch.tensor([0, 0, 2]), 4)  # contexts 1, 3 empty
    for row in (1, 3):
        assert torch.equal(mean[row], torch.zeros(8)) and torch.equal(variance[row], torch.ones(8))
    agent = small_agent()
    mean, variance = agent.context_posterior()                    # no transitions observed yet
    assert torch.equal(mean, torch.zeros(4, 8)) and torch.equal(variance, torch.ones(4, 8))
    policy = agent.evaluation_policy()
    policy.begin(episode_set([30], 3, 8, eval_seed=1))
    assert torch.equal(policy.posterior_mean(), torch.zeros(3, 8))


# --- per-row training context ---------------------------------------------------------------------
def test_training_context_of_a_row_is_cleared_on_its_auto_reset_and_only_then():
    agent = small_agent()
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30, 90, 110], seed=3)
    env.reset()
    current = [[] for _ in range(4)]     # encoder inputs of each row's current episode, kept here
    resets = 0

    def check(obs, actions, rewards, final_obs, terminated, truncated, ids, lengths):
        nonlocal resets
        features = transition_features(obs, actions, rewards, final_obs, 8)
        done = terminated | truncated
        for row in range(4):
            assert lengths[row] == len(current[row])
            current[row].append(features[row])
            if done[row]:
                current[row] = []
                resets += 1
                assert agent.episode_ids[row] > ids.max()           # a new episode id
            else:
                assert agent.episode_ids[row] == ids[row]
            assert agent.context_length[row] == len(current[row]) == env.t[row]
            n = len(current[row])
            if n:
                assert torch.equal(agent.context[row, :n], torch.stack(current[row]))
        mean, variance = agent.context_posterior()
        for row in range(4):
            if not current[row]:
                assert torch.equal(mean[row], torch.zeros(8)) and torch.equal(variance[row], torch.ones(8))
            else:
                expected, _ = agent.network.posterior(torch.stack(current[row]),
                                                      torch.zeros(len(current[row]), dtype=torch.long), 1)
                assert torch.allclose(mean[row], expected[0], atol=1e-6)

    drive(agent, env, 60, check)
    assert resets >= 8          # rule 0 ends at step 1, the others run to H = 8: both kinds of reset happen


def test_replay_context_is_the_transitions_before_the_sampled_one_in_its_episode():
    # a small buffer that has wrapped: contexts of the oldest episodes are partly overwritten and
    # must never be used
    agent = small_agent(buffer_size=100, batch_size=48, transitions_per_episode=4, learning_starts=10**9)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30, 90, 110], seed=5)
    env.reset()
    episodes: dict[int, list] = {}

    def record(obs, actions, rewards, final_obs, terminated, truncated, ids, lengths):
        features = transition_features(obs, actions, rewards, final_obs, 8)
        for row in range(4):
            episodes.setdefault(int(ids[row]), []).append(features[row])
            assert len(episodes[int(ids[row])]) == lengths[row] + 1

    drive(agent, env, 90, record)
    r = agent.replay
    assert r.size == r.capacity
    first_stored = {}
    for slot in range(r.capacity):
        e, k = int(r.episode[slot]), int(r.index[slot])
        first_stored[e] = min(first_stored.get(e, k), k)
    for _ in range(3):
        slots, before, upto = agent._sample()
        mean, variance = posterior_from_sums(*before)
        next_mean, next_variance = posterior_from_sums(*upto)
        for i, slot in enumerate(slots.tolist()):
            e, k = int(r.episode[slot]), int(r.index[slot])
            assert first_stored[e] == 0, "sampled a transition whose episode start was overwritten"
            assert torch.equal(transition_features(r.obs[slot], r.actions[slot], r.rewards[slot],
                                                   r.next_obs[slot], 8), episodes[e][k])
            transitions = torch.stack(episodes[e][:k + 1])
            ctx = torch.zeros(k + 1, dtype=torch.long)
            want_mean, want_var = agent.network.posterior(transitions[:k], ctx[:k], 1)
            assert torch.allclose(mean[i], want_mean[0], atol=1e-5) and torch.allclose(variance[i], want_var[0])
            want_mean, want_var = agent.network.posterior(transitions, ctx, 1)
            assert torch.allclose(next_mean[i], want_mean[0], atol=1e-5)
            assert torch.allclose(next_variance[i], want_var[0])


def test_sampled_episodes_report_their_stored_length():
    agent = small_agent(learning_starts=10**9)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30], seed=2)
    env.reset()
    drive(agent, env, 30)
    r = agent.replay
    first, length = r.sample_episodes(200, 8)
    for f, n in zip(first.tolist(), length.tolist()):
        e = int(r.episode[f])
        assert int(r.index[f]) == 0
        assert n == int((r.episode[:r.size] == e).sum())   # completed and in-progress episodes alike


# --- evaluation policy ----------------------------------------------------------------------------
class CheckingPolicy:
    """Wraps the PEARL evaluation policy and checks, before every action, that it conditions on the
    posterior mean of exactly the transitions its row's episode has had so far."""

    def __init__(self, policy, network, L):
        self.policy, self.network, self.L = policy, network, L
        self.checked = 0

    def begin(self, batch):
        self.policy.begin(batch)
        self.transitions = [[] for _ in range(len(batch))]
        self.ended = torch.zeros(len(batch), dtype=torch.bool)

    def act(self, obs):
        got = self.policy.posterior_mean()
        for row, seen in enumerate(self.transitions):
            if self.ended[row]:
                continue
            if not seen:
                assert torch.equal(got[row], torch.zeros_like(got[row]))
            else:
                want, _ = self.network.posterior(torch.stack(seen), torch.zeros(len(seen), dtype=torch.long), 1)
                assert torch.allclose(got[row], want[0], atol=1e-5)
            self.checked += 1
        actions = self.policy.act(obs)
        assert torch.equal(actions, self.network.q_values(obs, got).argmax(dim=1))
        return actions

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        features = transition_features(obs, actions, rewards, next_obs, self.L)
        for row in range(len(self.transitions)):
            if not self.ended[row]:
                self.transitions[row].append(features[row])
        self.ended |= terminated | truncated
        self.policy.observe(obs, actions, rewards, next_obs, terminated, truncated)


def test_evaluation_policy_conditions_on_exactly_the_episode_so_far():
    agent = small_agent()
    checking = CheckingPolicy(agent.evaluation_policy(), agent.network, 8)
    episodes = episode_set([0, 4, 30, 110], 3, 8, eval_seed=2)    # rule 0 ends after one step
    with torch.no_grad():
        run_episodes(checking, episodes, 8)
        run_episodes(checking, episodes, 8, batch_size=5)          # same object again: state is reset
    assert checking.checked > 100


@pytest.fixture(scope="module")
def briefly_trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("pearl_brief")
    spec = TrainSpec(agent="pearl_dqn", rules=(4, 30, 110), seed=1, hyperparameters=SMALL, L=8, H=8,
                     total_steps=800, eval_every=800)
    manifest = train(spec, run, quiet=True)
    agent, _ = ckpt.load_policy(run / manifest["checkpoints"][-1]["file"])
    return agent


def test_evaluation_policy_keeps_per_episode_state(briefly_trained):
    assert_per_episode_policy(lambda: briefly_trained.evaluation_policy())


def test_greedy_act_is_refused_in_favour_of_the_evaluation_policy(briefly_trained):
    with pytest.raises(ValueError, match="evaluation_policy"):
        briefly_trained.act(torch.zeros(2, 9), greedy=True)


# --- the shared contract --------------------------------------------------------------------------
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    # buffer_size 512 < 1200 steps: the ring buffer wraps before the end, so the episode bookkeeping
    # (ids, indices, overwritten episode starts) is part of what must resume exactly
    params = {"agent": {**SMALL, "buffer_size": 512}, "env": {"L": 8, "H": 8},
              "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical("pearl_dqn", params, tmp_path)


def test_learns_fixed_rule_4(tmp_path):
    before, after = learned_success("pearl_dqn", 4, 16, 16, 8_000, tmp_path)
    assert before < 0.9
    assert after >= 0.9
