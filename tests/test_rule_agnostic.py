"""The rule-agnostic rows (live_leftmost, live_random, mpc_prior), the rule-dependent headroom and the
floor-normalised score (docs/protocol.md#rule-agnostic-floors)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tapebench.methods.contract import EpisodeBatch
from tapebench.methods.identify_then_plan import Config as PlanConfig
from tapebench.methods.identify_then_plan import PriorPlanPolicy, decide
from tapebench.methods.live_policy import LivePolicy, live_actions
from tapebench.registry import PolicyContext, get_method, registry
from tapebench.stats.aggregate import aggregate_seeds, rule_agnostic_ids
from tapebench.stats.headroom import best_floor, headroom_ci, normalised_score, normalised_score_ci

L = 8


def _batch(keys, H=8):
    return EpisodeBatch(L=L, H=H, keys=np.asarray(keys, dtype=np.uint64), goal=np.zeros(L, np.uint8),
                        success_bonus=1.0, device=torch.device("cpu"))


def _obs(tapes, t=0.0):
    tapes = np.atleast_2d(tapes).astype(np.float32)
    return torch.from_numpy(np.concatenate([tapes, np.full((len(tapes), 1), t, np.float32)], axis=1))


TAPES = np.array([[0, 0, 1, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 1],
                  [0, 0, 0, 0, 0, 0, 0, 0]], dtype=np.uint8)


def test_the_registry_defines_the_rule_agnostic_set_once():
    assert set(rule_agnostic_ids()) == {"random", "live_leftmost", "live_random", "mpc_prior"}
    for m in ("live_leftmost", "live_random", "mpc_prior"):
        method = registry()[m]
        assert method.family == "rule_agnostic" and not method.trains and not method.sees_true_rule
    assert not get_method("mpc").rule_agnostic and not get_method("identify_then_plan").rule_agnostic


def test_leftmost_picks_the_lowest_live_cell_and_a_uniform_cell_when_none_is_live():
    words = np.arange(1, 5, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    actions = live_actions(TAPES, words, "leftmost")
    assert actions[:3].tolist() == [2, 0, 7]
    assert 0 <= actions[3] < L
    with pytest.raises(ValueError, match="live-cell choice must be one of"):
        live_actions(TAPES, words, "rightmost")


def test_random_live_picks_only_live_cells_and_all_of_them():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        words = rng.integers(0, 2 ** 63, size=4, dtype=np.uint64) * np.uint64(2)
        a = live_actions(TAPES, words, "random")
        assert TAPES[0, a[0]] == 1 and TAPES[1, a[1]] == 1 and a[2] == 7 and 0 <= a[3] < L
        seen.add(int(a[0]))
    assert seen == {2, 4, 5}


@pytest.mark.parametrize("choice", ["leftmost", "random"])
def test_live_policies_are_deterministic_per_seed_and_episode(choice):
    def play(seed, keys, rows=(3, 0)):
        policy = LivePolicy(choice, seed)
        policy.begin(_batch(keys))
        out = []
        done = torch.zeros(len(keys), dtype=torch.bool)
        for t in range(3):
            out.append(policy.act(_obs(TAPES[list(rows)])).numpy())
            policy.observe(None, None, None, None, done, done)
        return np.stack(out)

    first = play(0, [11, 12])
    assert np.array_equal(first, play(0, [11, 12]))
    # a row's draws depend only on its own episode identity, not on the batch
    assert np.array_equal(first[:, 1], play(0, [99, 12])[:, 1])
    if choice == "leftmost":
        assert (first[:, 1] == 2).all()
    # seeds are different streams (the empty tape's uniform cell over 20 episodes and 3 steps)
    streams = {tuple(play(s, list(range(40, 60)), rows=(3,) * 20).ravel().tolist()) for s in range(3)}
    assert len(streams) == 3


def test_the_prior_planner_never_updates_its_belief():
    prior = (30, 90, 110, 150)
    policy = PriorPlanPolicy(prior, PlanConfig(horizon=3, candidates=16), seed=5)
    tape = TAPES[[0]]
    policy.begin(_batch([7]))
    fresh = policy.act(_obs(tape)).item()
    # after transitions that pin the rule table (identify-then-plan would shrink its set), the same observation at
    # the same step and key gives the same action: the decision over the unchanged prior
    other = PriorPlanPolicy(prior, PlanConfig(horizon=3, candidates=16), seed=5)
    other.begin(_batch([7]))
    done = torch.zeros(1, dtype=torch.bool)
    for a, nxt in ((0, TAPES[[1]]), (3, TAPES[[2]])):
        other.observe(_obs(tape), torch.tensor([a]), None, _obs(nxt), done, done)
    other.t = 0
    assert other.act(_obs(tape)).item() == fresh
    assert other.prior.tolist() == list(prior)
    # it is identify-then-plan's decision over the prior set
    from tapebench.ca.packed import pack
    from tapebench.episodes.streams import step_key

    expected = decide(pack(tape)[0], np.asarray(prior, dtype=np.int64), np.uint64(step_key(policy.keys[0], 0)), 3, L,
                      np.uint64(0), float(L), 3, 16)
    assert fresh == expected


def test_the_prior_planner_needs_training_rules():
    method = get_method("mpc_prior")
    with pytest.raises(ValueError, match="needs at least one prior rule"):
        method.make_policy(method.Config(), PolicyContext(L=L, H=8, seed=0))
    policy = method.make_policy(method.Config(max_rules=2), PolicyContext(L=L, H=8, seed=0, train_rules=(4, 30, 90)))
    assert policy.prior.tolist() == [4, 30]


def test_headroom_and_normalised_score_closed_forms():
    reference, floor = np.array([0.5, 0.25, 1.0, 0.25]), np.array([0.25, 0.25, 0.5, 0.0])
    paired = headroom_ci(reference, floor, paired=True, n_resamples=500, rng=1)
    assert paired.mean == pytest.approx(0.25) and paired.low <= 0.25 <= paired.high and paired.n == 4
    # every unit's difference equal: the paired interval collapses onto it
    flat = headroom_ci(np.array([0.5, 0.75]), np.array([0.25, 0.5]), paired=True, n_resamples=200)
    assert (flat.low, flat.high) == (pytest.approx(0.25), pytest.approx(0.25))
    unpaired = headroom_ci(np.array([0.5, 0.5, 0.5]), np.array([0.25, 0.25]), paired=False, n_resamples=200)
    assert (unpaired.mean, unpaired.low, unpaired.high) == (pytest.approx(0.25),) * 3
    assert normalised_score(0.25, 0.25, 0.75) == 0.0 and normalised_score(0.75, 0.25, 0.75) == 100.0
    assert normalised_score(0.5, 0.25, 0.75) == 50.0 and normalised_score(0.0, 0.25, 0.75) == -50.0
    assert np.isnan(normalised_score(0.5, 0.3, 0.3))
    score = normalised_score_ci([0.5, 0.5], [0.25, 0.25], [0.75, 0.75], n_resamples=100)
    assert (score.mean, score.low, score.high) == (50.0, 50.0, 50.0)
    # resamples where the reference does not exceed the floor have no score: the interval is over the others,
    # NaN when they are fewer than ci of all
    some = normalised_score_ci([0.5] * 20, [0.25] * 19 + [0.3], [0.75] * 19 + [0.26], n_resamples=400)
    assert np.isfinite(some.low) and some.low <= some.mean <= some.high
    none = normalised_score_ci([0.5, 0.5], [0.25, 0.5], [0.5, 0.25], n_resamples=400)
    assert np.isnan(none.low) and np.isnan(none.high)
    assert best_floor({"random": [0.1, 0.2], "live_leftmost": [0.3, 0.2], "mpc_prior": [0.2, 0.2]}) == "live_leftmost"
    with pytest.raises(ValueError, match="at least one rule-agnostic row"):
        best_floor({})


def test_aggregate_rows_headroom_and_score_endpoints():
    means = {"mpc": (0.6, 0.5), "live_leftmost": (0.4, 0.3), "random": (0.1, 0.05), "dqn": (0.3, 0.1)}
    rows = [{"split": "main", "agent": a, "L": 8, "H": 8, "seed": s, "side": side, "metric": "success",
             "value": m[i] + 0.01 * s, "k_used": 1, "checkpoint_first": 0, "checkpoint_last": 0, "n_episodes": 4}
            for a, m in means.items() for s in range(3) for i, side in enumerate(("train", "test"))]
    agg = aggregate_seeds(pd.DataFrame(rows), n_resamples=200)
    cell = agg.set_index(["agent", "side", "metric"])["mean"]
    assert cell[("mpc", "train", "rule_headroom")] == pytest.approx(0.2)
    assert cell[("mpc", "test", "rule_headroom")] == pytest.approx(0.2)
    assert cell[("live_leftmost", "test", "agnostic_score")] == pytest.approx(0.0)     # the floor: 0
    assert cell[("dqn", "test", "agnostic_score")] == pytest.approx(100 * (0.11 - 0.31) / 0.2)
    assert ("mpc", "test", "agnostic_score") not in cell.index                        # the reference: 100 by definition
    # without a rule-agnostic row there is no floor, hence neither row
    none = aggregate_seeds(pd.DataFrame(rows), n_resamples=50, rule_agnostic=())
    assert not none["metric"].isin(["rule_headroom", "agnostic_score"]).any()
