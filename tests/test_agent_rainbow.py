"""Rainbow: it learns a fixed easy rule, resumes bit-identically after SIGKILL, and its parts do what
the spec says (docs/methods.md): n-step returns per environment that stop at termination and bootstrap from
the true last observation at truncation, the C51 projection, the proportional sum-tree and its
importance weights, noisy layers whose greedy evaluation draws nothing, and the Double-Q target."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_contract import (assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success,
                            tensors_equal)
from scipy import stats

from tapebench.methods.contract import EnvSpec, greedy_policy
from tapebench.methods.rainbow import NoisyLinear, NStepWindow, PrioritizedReplay, SumTree, project_distribution
from tapebench.registry import build_config, get_method, make_agent


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as training and evaluation use: on a busy 2-core machine the default two threads
    make each small log_softmax wait milliseconds for the other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_agent(L: int = 8, total_steps: int = 1000, **overrides):
    config = build_config("rainbow", {"num_envs": 2, "hidden_size": 16, **overrides})
    return make_agent("rainbow", config, EnvSpec.for_tape(L, L), total_steps, "cpu")


def test_registered_as_a_value_based_method():
    method = get_method("rainbow")
    assert method.display_name == "Rainbow" and method.family == "value_based" and method.trains
    assert method.training_env is None
    config = build_config("rainbow", {})
    assert (config.atoms, config.n_step, config.priority_alpha, config.priority_beta_start) == (51, 3, 0.5, 0.4)


@pytest.mark.parametrize("overrides,needle", [
    ({"v_min": 1.0, "v_max": 1.0}, "v_min < v_max"),
    ({"atoms": 1}, "atoms must be >= 2"),
    ({"priority_alpha": 1.5}, r"priority_alpha must be in \[0, 1\]"),
    ({"priority_beta_start": -0.1}, "priority_beta_start"),
    ({"n_step": 0}, "n_step must be >= 1"),
    ({"noisy_std": 0.0}, "noisy_std must be > 0"),
    ({"buffer_size": 8, "num_envs": 4}, r"buffer_size must be >= num_envs \* n_step = 12"),
])
def test_config_rejects_bad_values(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config("rainbow", overrides)


# --- the shared contract -------------------------------------------------------------------------
def test_learns_fixed_rule_4(tmp_path):
    before, after = learned_success("rainbow", 4, 16, 16, 6_000, tmp_path)
    assert before < 0.9
    assert after >= 0.9


def test_sigkill_resume_is_bit_identical(tmp_path):
    # learning starts at 200 env steps, before checkpoint 2 (600): the optimiser, the replay and its
    # priorities, the n-step windows and the noise buffers all matter for the resumed half
    params = {"agent": {"num_envs": 4, "hidden_size": 32, "batch_size": 16, "learning_starts": 200,
                        "target_update_frequency": 200},
              "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical("rainbow", params, tmp_path)


def test_greedy_evaluation_policy_is_per_episode():
    torch.manual_seed(0)
    agent = small_agent()
    assert_per_episode_policy(lambda: greedy_policy(agent))


# --- n-step returns ------------------------------------------------------------------------------
def test_n_step_returns_stop_at_termination_and_bootstrap_at_truncation():
    """Two environments, n = 3, γ = 0.5. Row 0 terminates at step 1, then runs on; row 1 is truncated at
    step 3, then starts again. Observations are ids (10 t + row); true successors are 100 + that."""
    window = NStepWindow(n=3, num_envs=2, obs_dim=1, gamma=0.5, device=torch.device("cpu"))
    rewards = {0: [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], 1: [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]}
    terminated_at, truncated_at = {1: 0}, {3: 1}   # step -> row
    emitted = []
    for t in range(6):
        obs = torch.tensor([[10.0 * t], [10.0 * t + 1]])
        actions = torch.tensor([t, t + 10])
        reward = torch.tensor([rewards[0][t], rewards[1][t]])
        terminated = torch.tensor([terminated_at.get(t) == row for row in (0, 1)])
        truncated = torch.tensor([truncated_at.get(t) == row for row in (0, 1)])
        out = window.push(obs, actions, reward, obs + 100, terminated, truncated)
        if out is not None:
            for o, a, g, d, nxt in zip(*out):
                emitted.append((t, int(o), int(a), float(g), float(d), int(nxt)))
        if t == 1:   # the terminated row's window is cleared, the other row's is not
            assert window.pending.tolist() == [0, 2]
    # (step emitted, obs id, action, n-step return, discount, bootstrap obs id)
    expected = {
        # row 0, episode 1: terminated at step 1 -> no bootstrap (discount 0)
        (1, 10, 1, 2.0, 0.0, 110), (1, 0, 0, 1.0 + 0.5 * 2.0, 0.0, 110),
        # row 0, episode 2 (steps 2..5): full windows, discount γ^3, bootstrap from the successor
        (4, 20, 2, 4.0 + 0.5 * 8.0 + 0.25 * 16.0, 0.125, 140), (5, 30, 3, 8.0 + 0.5 * 16.0 + 0.25 * 32.0, 0.125, 150),
        # row 1: a full window at step 2, then truncation at step 3 -> bootstrap from the true last
        # observation (id 131) with γ^m, m = steps to the end
        (2, 1, 10, -1.0 - 0.5 * 2.0 - 0.25 * 3.0, 0.125, 121),
        (3, 31, 13, -4.0, 0.5, 131), (3, 21, 12, -3.0 - 0.5 * 4.0, 0.25, 131),
        (3, 11, 11, -2.0 - 0.5 * 3.0 - 0.25 * 4.0, 0.125, 131),
    }
    assert len(emitted) == len(expected) and set(emitted) == expected
    assert window.pending.tolist() == [2, 2]   # steps 4, 5 of each row's current episode are pending


def test_agent_stores_n_step_transitions_with_the_largest_priority():
    agent = small_agent(L=4, n_step=2, gamma=0.5)
    obs = torch.zeros(2, 5)
    for t in range(3):
        done = torch.tensor([t == 1, False])
        agent.observe(obs + t, torch.tensor([t, t]), torch.tensor([1.0, 2.0]), obs + t + 1, done,
                      torch.tensor([False, False]))
    # step 1: row 0 terminates (its steps 1 and 0, no bootstrap), row 1's window of 2 is full; step 2: row 1
    assert agent.replay.size == 4 and agent.env_steps == 6
    assert agent.replay.returns[:4].tolist() == [1.0, 1.5, 3.0, 3.0]
    assert agent.replay.discounts[:4].tolist() == [0.0, 0.0, 0.25, 0.25]
    assert np.array_equal(agent.replay.tree.leaves(4), np.ones(4))   # max priority 1 ** α


# --- C51 projection ------------------------------------------------------------------------------
def test_c51_projection_matches_hand_computation():
    support = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0]).repeat(5, 1)
    returns = torch.tensor([0.5, 3.0, -2.0, 2.25, 4.0])
    discounts = torch.tensor([0.5, 1.0, 1.0, 0.0, 0.0])
    got = project_distribution(probs, returns, discounts, support)
    expected = torch.tensor([
        # 0.5 + 0.5 z = [0.5, 1, 1.5, 2, 2.5]: 0.5 splits 0.05 / 0.05, 1.5 splits 0.15 / 0.15
        [0.05, 0.05 + 0.2 + 0.15, 0.15 + 0.4, 0.0, 0.0],
        # 3 + z = [3, 4, 5, 6, 7] clipped at v_max = 4
        [0.0, 0.0, 0.0, 0.1, 0.9],
        # -2 + z = [-2, -1, 0, 1, 2] clipped at v_min = 0
        [0.6, 0.4, 0.0, 0.0, 0.0],
        # terminal (discount 0): all mass at 2.25 -> 0.75 on atom 2, 0.25 on atom 3
        [0.0, 0.0, 0.75, 0.25, 0.0],
        # terminal exactly at v_max
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ])
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.allclose(got.sum(dim=1), torch.ones(5))
    # inside the support the projection keeps the mean
    assert torch.isclose((got[0] * support).sum(), (probs[0] * (0.5 + 0.5 * support)).sum())


# --- prioritised replay --------------------------------------------------------------------------
def test_sum_tree_sampling_frequencies_follow_priorities_to_the_alpha():
    capacity = 10   # not a power of two: padding leaves must never be drawn
    replay = PrioritizedReplay(capacity, obs_dim=1, alpha=0.5, device=torch.device("cpu"))
    replay.add(torch.zeros(capacity, 1), torch.arange(capacity), torch.zeros(capacity), torch.zeros(capacity),
               torch.zeros(capacity, 1))
    priorities = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 0.1, 3.0, 16.0, 1.5, 6.0])
    replay.update_priorities(np.arange(capacity), priorities)
    torch.manual_seed(0)
    counts = np.zeros(capacity)
    batches, batch_size = 1500, 32
    for _ in range(batches):
        indices, _ = replay.sample(batch_size, beta=0.4)
        counts += np.bincount(indices, minlength=capacity)
    expected = priorities ** 0.5 / (priorities ** 0.5).sum() * batches * batch_size
    assert counts.sum() == batches * batch_size
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # the same counts are far from what α = 1 (or uniform replay) would give
    wrong = priorities / priorities.sum() * batches * batch_size
    assert stats.chisquare(counts, wrong).pvalue < 1e-12


def test_sum_tree_updates_keep_every_sum_consistent():
    tree = SumTree(13)
    rng = np.random.default_rng(0)
    for _ in range(300):
        indices = rng.integers(0, 13, size=rng.integers(1, 9))
        tree.update(indices, rng.random(len(indices)) * 10)
        internal = np.arange(1, tree.leaf_base)
        assert np.array_equal(tree.nodes[internal], tree.nodes[2 * internal] + tree.nodes[2 * internal + 1])
        assert np.isclose(tree.total, tree.leaves().sum(), rtol=1e-12)
    rebuilt = SumTree(13)
    rebuilt.leaves()[:] = tree.leaves()
    rebuilt.rebuild()
    assert np.array_equal(rebuilt.nodes, tree.nodes)
    tree.update(np.array([3, 5, 3]), np.array([1.0, 2.0, 7.0]))   # repeated index: the last value wins
    assert tree.leaves()[3] == 7.0 and tree.leaves()[5] == 2.0


def test_sum_tree_find_uses_prefix_sums():
    tree = SumTree(3)
    tree.update(np.arange(3), np.array([1.0, 2.0, 3.0]))
    assert tree.find(np.array([0.0, 0.999, 1.0, 2.999, 3.0, 5.999])).tolist() == [0, 0, 1, 1, 2, 2]


def test_importance_weights_are_normalised_by_the_largest_in_the_minibatch():
    replay = PrioritizedReplay(8, obs_dim=1, alpha=0.5, device=torch.device("cpu"))
    replay.add(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), torch.zeros(4), torch.zeros(4), torch.zeros(4, 1))
    replay.update_priorities(np.arange(4), np.array([1.0, 4.0, 9.0, 16.0]))   # p^α = 1, 2, 3, 4: P = .1 .. .4
    # w_i = (N P_i)^-β / max_j (N P_j)^-β over the minibatch = (P_min / P_i)^β
    assert np.allclose(replay.importance_weights(np.arange(4), beta=0.5), np.sqrt([1.0, 0.5, 1 / 3, 0.25]))
    assert np.allclose(replay.importance_weights(np.arange(4), beta=1.0), [1.0, 0.5, 1 / 3, 0.25])
    assert np.allclose(replay.importance_weights(np.array([3, 1, 1]), beta=1.0), [0.5, 1.0, 1.0])
    assert np.allclose(replay.importance_weights(np.arange(4), beta=0.0), 1.0)
    assert replay.max_priority == 16.0
    replay.add(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), torch.zeros(1), torch.zeros(1), torch.zeros(1, 1))
    assert replay.tree.leaves(5)[4] == 4.0   # a new transition gets the largest priority so far (16 ** 0.5)
    torch.manual_seed(0)
    indices, weights = replay.sample(64, beta=0.7)
    assert np.allclose(weights, replay.importance_weights(indices, 0.7)) and weights.max() == 1.0


def test_beta_anneals_from_start_to_one_over_the_budget():
    agent = small_agent(total_steps=1000)
    for steps, beta in ((0, 0.4), (500, 0.7), (1000, 1.0), (4000, 1.0)):
        agent.env_steps = steps
        assert agent.beta() == pytest.approx(beta)


# --- noisy layers --------------------------------------------------------------------------------
def test_noisy_linear_is_factorised_gaussian_noise_from_the_global_generator():
    torch.manual_seed(1)
    layer = NoisyLinear(3, 2, std_init=0.5)
    assert torch.allclose(layer.weight_sigma, torch.full((2, 3), 0.5 / np.sqrt(3)))
    torch.manual_seed(7)
    layer.resample()
    torch.manual_seed(7)
    f = lambda x: x.sign() * x.abs().sqrt()
    eps_in, eps_out = f(torch.randn(3)), f(torch.randn(2))
    assert torch.equal(layer.epsilon_in, eps_in) and torch.equal(layer.epsilon_out, eps_out)
    x = torch.randn(4, 3)
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(eps_out, eps_in)
    bias = layer.bias_mu + layer.bias_sigma * eps_out
    assert torch.allclose(layer(x), x @ weight.T + bias, atol=1e-6)
    assert torch.allclose(layer(x, noisy=False), x @ layer.weight_mu.T + layer.bias_mu, atol=1e-6)


def test_greedy_act_uses_mean_weights_is_deterministic_and_draws_nothing():
    torch.manual_seed(0)
    agent = small_agent()
    obs = torch.rand(64, 9)
    agent.act(obs)   # an exploring act: draws a noise sample
    rng_before, state_before = torch.get_rng_state(), agent.state_dict()
    greedy = agent.act(obs, greedy=True)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert tensors_equal(agent.state_dict(), state_before)
    assert torch.equal(agent.act(obs, greedy=True), greedy)
    with torch.no_grad():
        mean_q = (agent.online(obs, noisy=False).exp() * agent.support).sum(-1)
    assert torch.equal(greedy, mean_q.argmax(dim=1))
    agent.online.resample_noise()            # another noise sample does not change the greedy policy
    assert torch.equal(agent.act(obs, greedy=True), greedy)
    # exploring acts do draw: the noise buffers change and so do the noisy Q-values
    noise = agent.online.value_out.epsilon_out.clone()
    agent.act(obs)
    assert not torch.equal(agent.online.value_out.epsilon_out, noise)
    assert not torch.equal(torch.get_rng_state(), rng_before)


# --- Double Q ------------------------------------------------------------------------------------
def test_target_distribution_is_double_q():
    torch.manual_seed(3)
    agent = small_agent()
    with torch.no_grad():   # make the target network differ from the online one
        for p in agent.target.parameters():
            p.add_(torch.randn_like(p))
    agent.online.resample_noise()
    agent.target.resample_noise()
    next_obs = torch.rand(256, 9)
    returns, discounts = torch.rand(256) - 0.5, torch.full((256,), 0.97)
    got = agent.target_distribution(returns, discounts, next_obs)
    with torch.no_grad():
        online_pick = (agent.online(next_obs).exp() * agent.support).sum(-1).argmax(1)
        target_probs = agent.target(next_obs).exp()
        target_pick = (target_probs * agent.support).sum(-1).argmax(1)
    rows = torch.arange(256)
    assert torch.allclose(got, project_distribution(target_probs[rows, online_pick], returns, discounts,
                                                    agent.support))
    differ = online_pick != target_pick
    assert differ.any()   # the test can tell Double Q from a max over the target network
    max_target = project_distribution(target_probs[rows, target_pick], returns, discounts, agent.support)
    assert not torch.allclose(got[differ], max_target[differ])


def test_gradient_step_updates_priorities_of_the_sampled_transitions():
    torch.manual_seed(0)
    agent = small_agent(L=4, batch_size=8, learning_starts=0, train_frequency=2)
    obs = torch.rand(2, 5)
    for t in range(6):
        agent.observe(obs, torch.tensor([0, 1]), torch.tensor([-0.5, -0.25]), torch.rand(2, 5),
                      torch.tensor([False, False]), torch.tensor([t == 5, False]))
    assert agent.replay.size > 0
    leaves = agent.replay.tree.leaves(agent.replay.size).copy()
    metrics = agent.update()
    assert agent.gradient_steps >= 1 and "loss" in metrics and np.isfinite(metrics["loss"])
    assert not np.array_equal(agent.replay.tree.leaves(agent.replay.size), leaves)
