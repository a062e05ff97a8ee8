"""Identify-then-plan: the consistent set of rule tables (against a brute-force check on the reference
kernel), its decision equals true-dynamics MPC once the set is the true rule alone, replay, the
per-episode contract, config errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy

from tapebench.ca import reference
from tapebench.ca.packed import pack
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import candidate_action, episode_keys, step_key
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.contract import EpisodeBatch
from tapebench.methods.identify_then_plan import Config, IdentifyThenPlanPolicy, consistent_rules, decide, pinned_bits
from tapebench.methods.mpc import MPCConfig, MPCPolicy, _plan_action
from tapebench.registry import PolicyContext, build_config, get_method


def _obs(tapes):
    tapes = np.atleast_2d(tapes).astype(np.float32)
    return torch.from_numpy(np.concatenate([tapes, np.zeros((len(tapes), 1), np.float32)], axis=1))


def test_consistent_set_is_exactly_the_rules_that_reproduce_every_observed_transition():
    rng = np.random.default_rng(0)
    for rule in (30, 110, 0, 204, 90, 23):
        L = int(rng.integers(5, 10))
        policy = IdentifyThenPlanPolicy(Config(candidates=4), seed=0)
        policy.begin(EpisodeBatch(L=L, H=8, keys=np.array([3], np.uint64), goal=np.zeros(L, np.uint8),
                                  success_bonus=1.0, device=torch.device("cpu")))
        seen = []
        s = rng.integers(0, 2, L, dtype=np.uint8)
        for _ in range(4):
            a = int(rng.integers(L))
            s_next = reference.transition(s, a, rule)
            seen.append((s, a, s_next))
            policy.observe(_obs(s), torch.tensor([a]), None, _obs(s_next), torch.tensor([False]),
                           torch.tensor([False]))
            brute = [z for z in range(256) if all(np.array_equal(reference.transition(x, b, z), y)
                                                   for x, b, y in seen)]
            assert policy.consistent(0).tolist() == brute
            assert rule in brute
            s = s_next


def test_pinned_bits_of_a_de_bruijn_tape_identify_the_rule_in_one_step():
    x = np.array([0, 0, 0, 1, 0, 1, 1, 1], dtype=np.uint8)   # all 8 windows, cyclically
    for rule in (30, 110, 77):
        km, kv, ok = pinned_bits(pack(x)[0], pack(reference.ca_step(x, rule))[0], 8)
        assert ok and km == 0xFF and kv == rule
    km, kv, ok = pinned_bits(pack(np.zeros(8, np.uint8))[0], pack(np.ones(8, np.uint8))[0], 8)
    assert ok and km == 1 and kv == 1                         # only neighbourhood 000 seen, output 1
    bad = pack(np.array([1, 0, 0, 0, 0, 0, 0, 0], np.uint8))[0]
    assert not pinned_bits(pack(np.zeros(8, np.uint8))[0], bad, 8)[2]   # same neighbourhood, two outputs


def test_cap_takes_evenly_spaced_consistent_rules():
    assert consistent_rules(0, 0, 256).tolist() == list(range(256))
    assert consistent_rules(0, 0, 4).tolist() == [0, 64, 128, 192]
    assert consistent_rules(0b11111110, 0b10010110, 256).tolist() == [150, 151]


@pytest.mark.parametrize("L,goal,bonus", [(12, None, 1.0), (10, [1, 0] * 5, 0.5)])
def test_decision_with_the_true_rule_alone_is_the_mpc_decision(L, goal, bonus):
    rng = np.random.default_rng(L)
    goal_word = pack(np.zeros(L, np.uint8) if goal is None else np.array(goal, np.uint8))[0]
    for _ in range(60):
        rule, s = int(rng.integers(256)), pack(rng.integers(0, 2, L, dtype=np.uint8))[0]
        k_t = np.uint64(step_key(episode_keys(np.array([rng.integers(2**63)], np.uint64), 3)[0], int(rng.integers(16))))
        horizon, candidates = 5, 64
        depth = int(rng.integers(1, horizon + 1))
        tapes, score, alive = np.empty(candidates, np.uint64), np.empty(candidates), np.empty(candidates)
        want = _plan_action(s, rule, k_t, depth, L, goal_word, bonus * L, horizon, candidates, tapes, score, alive)
        got = decide(s, np.array([rule], np.int64), k_t, depth, L, goal_word, bonus * L, horizon, candidates)
        assert got == want


def _summed_return_decision(s, rules, k_t, depth, L, goal, score_bonus, horizon, candidates):
    """The definition, on the reference kernel: the first action of the candidate with the largest return
    summed over the rules (ties: lowest index)."""
    totals = []
    for c in range(candidates):
        seq = [candidate_action(k_t, c * horizon + k, L) for k in range(depth)]
        total = 0.0
        for rule in rules:
            tape = s.copy()
            for a in seq:
                tape = reference.transition(tape, a, rule)
                mismatches = int((tape != goal).sum())
                if mismatches == 0:
                    total += score_bonus
                    break
                total -= mismatches
        totals.append(total)
    return candidate_action(k_t, int(np.argmax(totals)) * horizon, L)


def test_decision_over_many_rules_is_the_best_summed_return_on_the_reference_kernel():
    rng = np.random.default_rng(7)
    for trial in range(12):
        L = int(rng.integers(5, 12))
        goal = rng.integers(0, 2, L, dtype=np.uint8) if trial % 2 else np.zeros(L, np.uint8)
        rules = np.array(sorted(rng.choice(256, int(rng.integers(2, 9)), replace=False)), np.int64)
        s = rng.integers(0, 2, L, dtype=np.uint8)
        k_t = np.uint64(step_key(episode_keys(np.array([rng.integers(2**63)], np.uint64), 1)[0], trial))
        horizon, candidates, bonus = 4, 24, float(rng.choice([0.5, 1.0]))
        depth = int(rng.integers(1, horizon + 1))
        got = decide(pack(s)[0], rules, k_t, depth, L, pack(goal)[0], bonus * L, horizon, candidates)
        assert got == _summed_return_decision(s, rules, k_t, depth, L, goal, bonus * L, horizon, candidates)


def test_identified_episodes_play_what_the_true_dynamics_mpc_plays_from_there():
    """Rule 0 (and any rule) is identified after the first transition from a tape showing every
    neighbourhood; from step 1 on, the two planners see the same consistent set {z} and the same keys."""
    L, H = 16, 8
    episodes = episode_set([30, 110, 45], 6, L, eval_seed=9, side="test", key=2)
    config = Config(horizon=4, candidates=64)

    class Log:
        def __init__(self, policy):
            self.policy, self.actions = policy, []

        def begin(self, batch):
            self.policy.begin(batch)

        def act(self, obs):
            a = self.policy.act(obs)
            self.actions.append((obs.clone(), a.clone()))
            return a

        def observe(self, *args):
            self.policy.observe(*args)

    itp = Log(IdentifyThenPlanPolicy(config, seed=4))
    run_episodes(itp, episodes, H)
    known = itp.policy.known_mask
    # replay every decision after identification with MPC on the true rule from the same state and step key
    mpc = MPCPolicy(MPCConfig(horizon=4, candidates=64, seed=4))
    keys = episode_keys(episodes.keys, 4)
    checked = 0
    identified = np.zeros(len(episodes), bool)
    ended = np.zeros(len(episodes), bool)    # reached the goal: later actions of the row are ignored
    for t, (obs, a) in enumerate(itp.actions[:-1]):
        next_obs = itp.actions[t + 1][0]
        ended |= ~obs[:, :L].bool().any(dim=1).numpy()
        for i in np.flatnonzero(~ended):
            s, s_next = pack(obs[i, :L].numpy().astype(np.uint8))[0], pack(next_obs[i, :L].numpy().astype(np.uint8))[0]
            if identified[i]:
                tapes, score, alive = np.empty(64, np.uint64), np.empty(64), np.empty(64)
                want = _plan_action(s, int(episodes.rules[i]), np.uint64(step_key(keys[i], t)), min(4, H - t), L, np.uint64(0),
                                    float(L), 4, 64, tapes, score, alive)
                assert int(a[i]) == want
                checked += 1
            km, _, _ = pinned_bits(s ^ (np.uint64(1) << np.uint64(int(a[i]))), s_next, L)
            identified[i] |= km == 0xFF
    assert checked > 20 and known.max() == 0xFF


def test_records_replay_and_it_never_needs_the_true_rule():
    L, H = 10, 10
    episodes = episode_set([30, 110, 4, 0, 150], 3, L, eval_seed=1, side="test", key=3)
    policy = get_method("identify_then_plan").make_policy(build_config("identify_then_plan", {"candidates": 64}),
                                                          PolicyContext(L=L, H=H, seed=1))
    assert not get_method("identify_then_plan").sees_true_rule
    actions = []

    def logged(obs):
        a = policy.act(obs)
        actions.append(a.numpy().copy())
        return a

    class P:
        begin, observe, act = policy.begin, policy.observe, staticmethod(logged)

    results = run_episodes(P(), episodes, H)
    log = np.stack(actions, axis=1)
    for i, tape in enumerate(episodes.tapes):
        s = tape.copy()
        for t in range(int(results["steps"][i])):
            s = reference.transition(s, int(log[i, t]), int(episodes.rules[i]))
        assert int(s.sum()) == int(np.rint(results["final_dist"][i] * L))
        assert (s.sum() == 0) == results["success"][i]


def test_per_episode_contract():
    assert_per_episode_policy(lambda: IdentifyThenPlanPolicy(Config(horizon=3, candidates=32), seed=2))
    assert_per_episode_policy(lambda: IdentifyThenPlanPolicy(Config(horizon=3, candidates=16, max_rules=3), seed=0))


@pytest.mark.parametrize("overrides,needle", [
    ({"max_rules": 0}, "max_rules must be an integer in 1..256"), ({"max_rules": 300}, "max_rules"),
    ({"candidates": 0}, r"candidates must be an integer in 1\.\.65536"), ({"horizon": -1}, "horizon"),
])
def test_bad_config_values_name_the_field(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config("identify_then_plan", overrides)
