"""Bayes filter (belief family): posterior concentration, the greedy controller it reduces to, exact replay
through the environment, score and information gain against a brute-force implementation, exact ties, and
config errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy

from tapebench.ca import reference
from tapebench.ca.packed import pack
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import step_keys, uniform_below
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.bayes_filter import BAYES_DOMAIN, BayesFilterPolicy, Config, action_scores
from tapebench.methods.contract import EpisodeBatch
from tapebench.methods.identify_then_plan import pinned_bits
from tapebench.registry import PolicyContext, build_config, get_method

METRICS = ("success", "final_dist", "auc_dist", "return", "steps")


class Spy:
    """Wraps a policy and logs its actions (N, H), -1 after a row's episode ended."""

    def __init__(self, policy, H):
        self.policy, self.H = policy, H

    def begin(self, batch):
        self.policy.begin(batch)
        self.log = np.full((len(batch), self.H), -1, dtype=np.int64)
        self.live = np.ones(len(batch), dtype=bool)
        self.t = 0

    def act(self, obs):
        actions = self.policy.act(obs)
        self.log[self.live, self.t] = actions.numpy()[self.live]
        return actions

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        self.policy.observe(obs, actions, rewards, next_obs, terminated, truncated)
        self.live &= ~(terminated | truncated).numpy()
        self.t += 1


def _batch(keys, L, H=32, goal=None):
    goal = np.zeros(L, dtype=np.uint8) if goal is None else goal
    return EpisodeBatch(L=L, H=H, keys=np.asarray(keys, dtype=np.uint64), goal=goal, success_bonus=1.0,
                        device=torch.device("cpu"))


def _obs(tapes):
    tapes = np.atleast_2d(tapes).astype(np.float32)
    return torch.from_numpy(np.concatenate([tapes, np.zeros((len(tapes), 1), np.float32)], axis=1))


@pytest.mark.parametrize("rule,candidates", [(30, range(256)), (110, range(256)), (90, (4, 30, 45, 90, 105, 150)),
                                             (54, range(0, 256, 2))])
def test_posterior_concentrates_on_the_true_rule_once_every_neighbourhood_is_seen_twice(rule, candidates):
    L, rng = 16, np.random.default_rng(rule)
    policy = BayesFilterPolicy(candidates, Config(), seed=0)
    policy.begin(_batch([7], L))
    true_col = list(policy.rules).index(rule)
    seen = np.zeros(8, dtype=int)
    s = rng.integers(0, 2, L, dtype=np.uint8)
    for t in range(40):
        a = int(rng.integers(L))
        x = reference.flip(s, a)
        s_next = reference.transition(s, a, rule)
        for i in range(L):
            seen[4 * x[(i - 1) % L] + 2 * x[i] + x[(i + 1) % L]] += 1
        policy.observe(_obs(s), torch.tensor([a]), None, _obs(s_next), torch.tensor([False]), torch.tensor([False]))
        b = policy.posterior()[0]
        assert b[true_col] == b.max()   # noise-free: the true rule never mispredicts
        if seen.min() >= 2:
            assert b[true_col] > 0.99, (t, b[true_col])
            break
        s = s_next
    else:
        pytest.fail("the random transitions never showed every neighbourhood twice")


def test_posterior_is_the_normalised_product_of_per_cell_likelihoods():
    L, rng, eps = 10, np.random.default_rng(0), 0.05
    candidates = (3, 30, 60, 90, 110, 150, 204)
    policy = BayesFilterPolicy(candidates, Config(epsilon=eps), seed=0)
    policy.begin(_batch([1], L))
    loglik = np.zeros(len(candidates))
    s = rng.integers(0, 2, L, dtype=np.uint8)
    for _ in range(3):
        a = int(rng.integers(L))
        s_next = reference.transition(s, a, 110)
        for j, z in enumerate(sorted(candidates)):
            match = reference.transition(s, a, z) == s_next
            loglik[j] += np.sum(np.where(match, np.log(1 - eps), np.log(eps)))
        policy.observe(_obs(s), torch.tensor([a]), None, _obs(s_next), torch.tensor([False]), torch.tensor([False]))
        s = s_next
    expected = np.exp(loglik - loglik.max())
    np.testing.assert_allclose(policy.posterior()[0], expected / expected.sum(), rtol=1e-12)


def _greedy_reference(episodes, H, rule, seed):
    """Independent one-step greedy controller on the reference kernel: the fewest mismatches after one step,
    ties -> the k-th tied cell in ascending order, k = floor(n_ties * u) from the filter's stream."""
    L = episodes.tapes.shape[1]
    keys = step_keys(episodes.keys, BAYES_DOMAIN, seed)
    log = np.full((len(episodes), H), -1, dtype=np.int64)
    for i, tape in enumerate(episodes.tapes):
        s = tape.copy()
        for t in range(H):
            mism = [int(np.sum(reference.transition(s, a, rule))) for a in range(L)]
            ties = [a for a in range(L) if mism[a] == min(mism)]
            k = int(uniform_below(step_keys(keys[i:i + 1], t, seed), len(ties))[0])
            log[i, t] = ties[k]
            s = reference.transition(s, ties[k], rule)
            if not s.any():
                break
    return log


@pytest.mark.parametrize("rule", [30, 110, 4, 90, 184])
def test_single_candidate_without_information_gain_is_the_one_step_greedy_controller(rule):
    L, H, seed = 10, 10, 3
    episodes = episode_set([rule], 6, L, eval_seed=2, side="test", key=5)
    spy = Spy(BayesFilterPolicy([rule], Config(beta=0.0), seed=seed), H)
    run_episodes(spy, episodes, H)
    assert np.array_equal(spy.log, _greedy_reference(episodes, H, rule, seed))


def test_ties_are_broken_at_random_per_episode_and_seed():
    # rule 204 (identity) from the same tape: every 0-cell flip adds one mismatch, every 1-cell flip removes one
    L = 12
    tape = np.array([1, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0], dtype=np.uint8)
    keys = np.arange(400, dtype=np.uint64) * np.uint64(7919)
    for seed in (0, 1):
        policy = BayesFilterPolicy([204], Config(beta=0.0), seed=seed)
        policy.begin(_batch(keys, L))
        chosen = policy.act(_obs(np.repeat(tape[None], len(keys), axis=0))).numpy()
        ones = np.flatnonzero(tape)
        assert set(chosen) == set(ones)                               # only the best actions, all of them
        counts = np.bincount(chosen, minlength=L)[ones]
        assert counts.min() > len(keys) / len(ones) / 2
        if seed == 0:
            first = chosen
    assert not np.array_equal(first, chosen)


def _replay(episodes, log, rule_of_row, H):
    finals = []
    for i, tape in enumerate(episodes.tapes):
        s = tape.copy()
        for a in log[i]:
            if a < 0:
                break
            s = reference.transition(s, int(a), int(rule_of_row[i]))
        finals.append(int(s.sum()))
    return np.array(finals)   # mismatch counts with the all-zero goal


@pytest.mark.parametrize("method", ["bayes_filter", "bayes_filter_full"])
def test_records_replay_exactly_through_the_reference_kernel(method):
    L, H = 12, 12
    episodes = episode_set([30, 110, 4, 90, 0, 150], 4, L, eval_seed=1, side="test", key=3)
    context = PolicyContext(L=L, H=H, seed=2, train_rules=(4, 30, 90, 110, 150))
    spy = Spy(get_method(method).make_policy(build_config(method, {}), context), H)
    results = run_episodes(spy, episodes, H)
    final = _replay(episodes, spy.log, episodes.rules, H)
    assert np.array_equal(final, np.rint(results["final_dist"] * L))   # the env's distance is float32
    np.testing.assert_allclose(final / L, results["final_dist"], rtol=1e-6)
    assert np.array_equal(final == 0, results["success"])
    assert np.array_equal((spy.log >= 0).sum(axis=1), results["steps"])
    assert 0 < results["success"].mean() < 1


def _brute_force(tape, posterior, rules, goal, beta):
    L = len(tape)
    scores, igs = np.empty(L), np.empty(L)
    for a in range(L):
        groups, expected = {}, 0.0
        for b, z in zip(posterior, rules):
            pred = reference.transition(tape, a, int(z))
            expected += b * reference.distance(pred, goal)
            groups[pred.tobytes()] = groups.get(pred.tobytes(), 0.0) + b
        p = np.array([v for v in groups.values() if v > 0])
        igs[a] = float(-(p * np.log(p)).sum())
        scores[a] = -expected + beta * igs[a]
    return scores, igs


def test_scores_and_information_gain_match_a_brute_force_implementation():
    rng = np.random.default_rng(11)
    for case in range(40):
        L = int(rng.integers(4, 11))
        rules = np.sort(rng.choice(256, size=int(rng.integers(1, 40)), replace=False))
        if case % 3 == 0:      # posterior with exact ties and exact zeros, as the filter produces
            w = np.exp(-4.6 * rng.integers(0, 4, len(rules)).astype(float))
            w[rng.random(len(rules)) < 0.2] = 0.0
            w[0] = max(w[0], 1.0)
        else:
            w = rng.dirichlet(np.full(len(rules), 0.3))
        posterior = w / w.sum()
        tape = rng.integers(0, 2, L, dtype=np.uint8)
        goal = rng.integers(0, 2, L, dtype=np.uint8) if case % 4 == 1 else np.zeros(L, dtype=np.uint8)
        beta = float(rng.choice([0.0, 0.25, 1.0]))
        got_s, got_ig = action_scores(tape, posterior, rules, goal, beta)
        want_s, want_ig = _brute_force(tape, posterior, rules, goal, beta)
        np.testing.assert_allclose(got_ig, want_ig, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got_s, want_s, rtol=1e-10, atol=1e-12)
        assert (got_ig >= -1e-15).all() and (got_ig <= math.log(len(rules)) + 1e-12).all()


def test_actions_related_by_a_symmetry_of_the_tape_tie_exactly():
    """On a tape of period 4, actions a and a + 4 predict shifted copies of the same groups; the canonical
    summation order makes their scores bit-identical whatever the (non-dyadic) posterior."""
    rng = np.random.default_rng(5)
    tape = np.tile(np.array([1, 1, 0, 1], dtype=np.uint8), 4)
    rules = np.sort(rng.choice(256, size=60, replace=False))
    for _ in range(10):
        posterior = rng.dirichlet(np.full(len(rules), 0.5))
        scores, igs = action_scores(tape, posterior, rules, np.zeros(16, dtype=np.uint8), 0.25)
        for a in range(12):
            assert scores[a] == scores[a + 4] and igs[a] == igs[a + 4]


def test_information_gain_prefers_the_action_that_separates_the_candidates():
    # 204 (identity) and 236 = 204 | 32 differ only on neighbourhood 101: actions whose post-action tape shows
    # a 101 split the two candidates (IG = log 2), the others do not (IG = 0)
    L = 8
    tape = np.zeros(L, dtype=np.uint8)
    tape[[2, 4]] = 1
    scores_no_ig, _ = action_scores(tape, [0.5, 0.5], [204, 236], np.zeros(L, np.uint8), 0.0)
    scores_ig, igs = action_scores(tape, [0.5, 0.5], [204, 236], np.zeros(L, np.uint8), 0.25)
    separating = igs > 0
    assert separating.any() and not separating.all()
    assert np.allclose(igs[separating], math.log(2))
    np.testing.assert_allclose(scores_ig - scores_no_ig, 0.25 * igs)


def test_per_episode_contract():
    assert_per_episode_policy(lambda: BayesFilterPolicy(range(256), Config(), seed=1))
    assert_per_episode_policy(lambda: BayesFilterPolicy((30, 110, 90, 4, 54), Config(beta=0.0), seed=2))


@pytest.mark.parametrize("overrides,needle", [
    ({"epsilon": 0.5}, "epsilon must be in \\(0, 0.5\\)"), ({"epsilon": 0.0}, "epsilon must be in \\(0, 0.5\\)"),
    ({"epsilon": -0.1}, "epsilon"), ({"beta": -0.01}, "beta must be >= 0"), ({"beta": float("nan")}, "beta"),
    ({"epsilon": "small"}, "epsilon"),
])
def test_bad_config_values_name_the_field(overrides, needle):
    for method in ("bayes_filter", "bayes_filter_full"):
        with pytest.raises(ValueError, match=needle):
            build_config(method, overrides)


def test_registry_rows_and_candidate_sets():
    train, full = get_method("bayes_filter"), get_method("bayes_filter_full")
    assert (train.display_name, full.display_name) == ("Bayes filter (train)", "Bayes filter (full)")
    assert train.family == full.family == "belief" and not train.sees_true_rule and not train.trains
    context = PolicyContext(L=8, H=8, seed=0, train_rules=(110, 30, 4))
    assert train.make_policy(Config(), context).rules.tolist() == [4, 30, 110]
    assert full.make_policy(Config(), context).rules.tolist() == list(range(256))
    with pytest.raises(ValueError, match="needs the split's training rules"):
        train.make_policy(Config(), PolicyContext(L=8, H=8, seed=0))
