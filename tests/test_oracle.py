"""Oracles: random-shooting MPC, the exact DP controller, feasibility (docs/protocol.md#oracle, #decisions)."""
import numba
import numpy as np
import pytest
import torch

from tapebench.ca import reference
from tapebench.ca.packed import pack
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import candidate_actions, episode_keys, step_key
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.exact import check_exact_length, run_exact, value_tables
from tapebench.methods.mpc import MPCConfig, run_mpc
from tapebench.oracle.feasibility import feasibility_summary, feasibility_table

METRICS = ("success", "final_dist", "auc_dist", "return", "steps")


class Replay:
    """Evaluation policy that replays an action log through the batched environment."""

    def __init__(self, actions):
        self.actions = torch.as_tensor(actions.astype(np.int64)).clamp(min=0)
        self.t = 0

    def __call__(self, obs):
        self.t += 1
        return self.actions[:, self.t - 1]


def test_mpc_on_rule_0_succeeds_at_step_1():
    episodes = episode_set([0], 8, 32)
    out = run_mpc(episodes, 32)
    assert out["success"].all() and (out["steps"] == 1).all()
    assert np.all(out["return"] == 1.0) and np.all(out["auc_dist"] == 0.0) and np.all(out["final_dist"] == 0.0)


def test_mpc_records_equal_the_evaluation_runner_on_the_same_actions():
    # non-power-of-two L: the float32 reward / distance accounting must match the environment's exactly
    episodes = episode_set([4, 30, 90, 110, 204], 3, 11)
    out = run_mpc(episodes, 9, MPCConfig(horizon=3, candidates=32), success_bonus=0.3)
    replayed = run_episodes(Replay(out["actions"]), episodes, 9, success_bonus=0.3)
    for key in METRICS:
        np.testing.assert_array_equal(out[key], replayed[key], err_msg=key)


def _python_mpc_episode(tape, rule, key, H, horizon, candidates, bonus=1.0):
    """Plain restatement of docs/protocol.md#decisions on the reference kernel: score = return of the
    candidate truncated at the remaining steps and at success; ties go to the lowest candidate index."""
    L = len(tape)
    actions = []
    for t in range(H):
        cand = candidate_actions(np.uint64(step_key(key, t)), candidates, horizon, L)
        scores = []
        for c in range(candidates):
            s, score = tape, 0.0
            for k in range(min(horizon, H - t)):
                s = reference.transition(s, int(cand[c, k]), rule)
                d = int(np.sum(s))
                if d == 0:
                    score += bonus * L
                    break
                score -= d
            scores.append(score)
        best = int(np.argmax(scores))   # first maximum
        tape = reference.transition(tape, int(cand[best, 0]), rule)
        actions.append(int(cand[best, 0]))
        if not tape.any():
            break
    return actions


def test_mpc_follows_the_spec_scoring_rule():
    episodes = episode_set([30, 54, 110], 2, 8)
    config = MPCConfig(horizon=3, candidates=12, seed=7)
    out = run_mpc(episodes, 6, config)
    keys = episode_keys(episodes.keys, config.seed)
    for i in range(len(episodes)):
        expected = _python_mpc_episode(episodes.tapes[i], int(episodes.rules[i]), keys[i], 6, 3, 12)
        got = [int(a) for a in out["actions"][i] if a >= 0]
        assert got == expected


def test_mpc_is_deterministic_and_independent_of_batch_and_threads():
    full = episode_set([30, 45, 110], 4, 16)
    config = MPCConfig(horizon=4, candidates=64, seed=1)
    first = run_mpc(full, 16, config)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        single = run_mpc(full, 16, config)
    finally:
        numba.set_num_threads(threads)
    sub = episode_set([45], 4, 16)
    alone = run_mpc(sub, 16, config)
    rows = full.rules == 45
    for key in (*METRICS, "actions"):
        np.testing.assert_array_equal(first[key], single[key])
        np.testing.assert_array_equal(first[key][rows], alone[key])
    other_seed = run_mpc(full, 16, MPCConfig(horizon=4, candidates=64, seed=2))
    assert not np.array_equal(first["actions"], other_seed["actions"])


def test_mpc_config_rejects_bad_budgets():
    with pytest.raises(ValueError, match=r"candidates must be an integer in 1\.\.65536, got 0"):
        MPCConfig(candidates=0)
    with pytest.raises(ValueError, match="horizon"):
        MPCConfig(horizon=-1)


def _reference_tables(L):
    """F_z(tape) for every rule and tape from the reference kernel. ca_step is linear in the rule's truth
    table (cell i reads bit idx_i), so the 8 unit rules 2^k give every rule's update."""
    N = 1 << L
    tapes = ((np.arange(N)[:, None] >> np.arange(L)) & 1).astype(np.uint8)
    unit = np.stack([[reference.ca_step(t, 1 << k) for t in tapes] for k in range(8)])   # (8, N, L)
    rule_bits = (np.arange(256)[:, None] >> np.arange(8)) & 1                         # (256, 8)
    cells = np.einsum("zk,knl->znl", rule_bits, unit)                                 # (256, N, L)
    return tapes, cells @ (1 << np.arange(L))                                          # (256, N) packed


def _brute_force(tapes, F, L, H):
    """Reachable-set propagation over the explicit transition graph (flip cell a, then F).
    Returns (first step at which the goal is reachable or 255, least final mismatch count, 0 on success)."""
    N = 1 << L
    succ = F[np.arange(N)[:, None] ^ (1 << np.arange(L))[None, :]]
    adjacency = np.zeros((N, N), dtype=np.float32)
    adjacency[np.repeat(np.arange(N), L), succ.ravel()] = 1.0
    reach, first = adjacency.copy(), np.full(N, 255)
    for k in range(1, H + 1):
        first[(reach[:, 0] > 0) & (first == 255)] = k
        if k < H:
            reach[:, 0] = 0.0   # reaching the goal ends the episode
            reach = (reach @ adjacency > 0).astype(np.float32)
    final = np.where(reach > 0, tapes.sum(axis=1)[None, :], 10 ** 6).min(axis=1)
    return first, np.where(first <= H, 0, final)


@pytest.fixture(scope="module")
def reference_tables():
    return {L: _reference_tables(L) for L in (6, 7, 8)}


@pytest.mark.parametrize("L,H", [(6, 6), (7, 5), (8, 4)])
def test_dp_agrees_with_brute_force_on_all_rules(L, H, reference_tables):
    tapes, F = reference_tables[L]
    for rule in range(256):
        first, final = _brute_force(tapes, F[rule], L, H)
        _, d, W = value_tables(rule, L, H)
        np.testing.assert_array_equal(d, first, err_msg=f"steps to goal, rule {rule}, L={L}")
        np.testing.assert_array_equal(W[H], final, err_msg=f"least final mismatch, rule {rule}, L={L}")


def test_exact_controller_achieves_the_dp_value_and_is_never_worse_than_mpc():
    L = H = 10
    rules = list(range(0, 256, 5))
    episodes = episode_set(rules, 3, L)
    exact = run_exact(episodes, H)
    mpc = run_mpc(episodes, H, MPCConfig(horizon=4, candidates=32))
    starts = pack(episodes.tapes)
    for rule in rules:
        _, d, W = value_tables(rule, L, H)
        rows = np.flatnonzero(episodes.rules == rule)
        s0 = starts[rows].astype(np.int64)
        np.testing.assert_array_equal(exact["success"][rows], d[s0] <= H)
        np.testing.assert_array_equal(exact["steps"][rows], np.where(d[s0] <= H, d[s0], H))
        np.testing.assert_array_equal(np.rint(exact["final_dist"][rows] * L), W[H][s0])
    # lexicographic: success first, then final distance
    assert not np.any(mpc["success"] & ~exact["success"])
    same = mpc["success"] == exact["success"]
    assert np.all(exact["final_dist"][same] <= mpc["final_dist"][same])
    replayed = run_episodes(Replay(exact["actions"]), episodes, H)
    for key in METRICS:
        np.testing.assert_array_equal(exact[key], replayed[key], err_msg=key)


def test_exact_rejects_tapes_too_long_for_the_dp():
    with pytest.raises(ValueError, match=r"needs L in 3\.\.20, got L=21"):
        check_exact_length(21)
    with pytest.raises(ValueError, match="L=32"):
        run_exact(episode_set([0], 1, 32), 32)
    with pytest.raises(ValueError, match="L=24"):
        feasibility_table([0], 24, 8)


def test_feasibility_table_counts_reachable_tapes():
    frame = feasibility_table([0, 30, 255], 8, 8)
    by_rule = frame.set_index("rule")
    assert by_rule.loc[0, "solvable_fraction"] == 1.0 and by_rule.loc[0, "steps_1"] == 1.0
    assert by_rule.loc[255, "solvable_tapes"] == 0 and not by_rule.loc[255, "any_solvable"]
    assert by_rule.loc[255, "optimal_final_dist_mean"] == 1.0   # rule 255 maps every tape to all ones
    step_cols = [f"steps_{k}" for k in range(1, 9)]
    np.testing.assert_allclose(frame[step_cols].sum(axis=1), frame["solvable_fraction"])
    _, d, _ = value_tables(30, 8, 8)
    assert by_rule.loc[30, "solvable_tapes"] == int(np.sum(d[1:] <= 8))
    summary = feasibility_summary(frame)
    assert summary["rules_with_solvable_tape"] == 2 and summary["rulewise_solvable"] == pytest.approx(2 / 3)
