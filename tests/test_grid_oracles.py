"""The grid oracles (docs/protocol.md#grid-oracles): true-dynamics MPC, the exact optimum by search over all
2^(n²) grids (n ≤ 4) and the Bayes filters, each checked against brute force on small grids."""
from __future__ import annotations

import numpy as np
import pytest

from tapebench.ca import grid_reference
from tapebench.episodes.streams import candidate_actions
from tapebench.grid_rules import MOORE, VON_NEUMANN
from tapebench.methods.grid_mpc import plan_action, run_grid_mpc
from tapebench.methods.mpc import MPCConfig


def random_grids(count, n, seed=0):
    grids = np.random.default_rng(seed).integers(0, 2, (count, n, n), dtype=np.uint8)
    grids[grids.reshape(count, -1).sum(axis=1) == 0, 0, 0] = 1
    return grids


def replay(start, actions, rule):
    """Live-cell counts after each logged action, by the NumPy reference."""
    grid, lives = start, []
    for a in actions[actions >= 0]:
        grid = grid_reference.transition(grid, int(a), rule)
        lives.append(int(grid.sum()))
    return lives


def test_mpc_solves_the_rule_where_every_cell_dies_in_one_step():
    out = run_grid_mpc(random_grids(12, 4), ["B/S"] * 12, MOORE, H=8, config=MPCConfig(4, 32, 0))
    assert out["success"].all() and (out["steps"] == 1).all() and (out["return"] == 1.0).all()


def test_mpc_plays_what_the_reference_dynamics_say():
    rules = ["B3/S23", "B36/S23", "B2/S", "B1/S1"] * 3
    family_rules = [MOORE.rule(r) for r in rules]
    starts = random_grids(12, 4, seed=1)
    starts[0] = 0
    starts[0, 1, 2] = 1          # a lone live cell under Life: any flip leaves <= 2 live cells, which all die
    out = run_grid_mpc(starts, rules, MOORE, H=6, config=MPCConfig(3, 64, 5))
    assert out["success"][0] and out["steps"][0] == 1
    for i in range(12):
        lives = replay(starts[i], out["actions"][i], family_rules[i])
        assert len(lives) == out["steps"][i]
        assert out["success"][i] == (lives[-1] == 0)
        assert out["final_dist"][i] == pytest.approx(lives[-1] / 16)
        assert all(live > 0 for live in lives[:-1])


def test_mpc_is_a_pure_function_of_its_seed_and_the_episode_keys():
    starts = random_grids(8, 4, seed=2)
    rules = [VON_NEUMANN.rule(z) for z in range(100, 900, 100)]
    a = run_grid_mpc(starts, rules, VON_NEUMANN, H=5, config=MPCConfig(3, 16, 7), keys=np.arange(8) + 40)
    b = run_grid_mpc(starts[::-1], rules[::-1], VON_NEUMANN, H=5, config=MPCConfig(3, 16, 7),
                     keys=(np.arange(8) + 40)[::-1])
    for key in ("success", "steps", "actions", "return"):
        assert np.array_equal(a[key], b[key][::-1])
    c = run_grid_mpc(starts, rules, VON_NEUMANN, H=5, config=MPCConfig(3, 16, 8), keys=np.arange(8) + 40)
    assert not np.array_equal(a["actions"], c["actions"])


@pytest.mark.parametrize("rule", ["B3/S23", "B1/S12V", "B0/S8"])
def test_one_decision_picks_the_best_candidate_under_the_scoring(rule):
    rule = MOORE.rule(rule) if not rule.endswith("V") else VON_NEUMANN.rule(rule)
    grid = random_grids(1, 3, seed=3)[0]
    horizon, candidates, depth, key = 4, 24, 3, 0x1234_5678_9ABC_DEF0
    action, scores = plan_action(grid, rule, rule.family, key, depth, MPCConfig(horizon, candidates, 0))
    seqs = candidate_actions(np.uint64(key), candidates, horizon, 9)
    expected = []
    for seq in seqs:
        g, score = grid, 0.0
        for a in seq[:depth]:
            g = grid_reference.transition(g, int(a), rule)
            if g.sum() == 0:
                score += 9.0
                break
            score -= g.sum()
        expected.append(score)
    assert np.array_equal(scores, expected)
    assert action == seqs[int(np.argmax(expected)), 0]
