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


def brute_force_optimum(rule, H):
    """(fewest steps to the goal, capped at 255 beyond H; least final live count) from every non-goal 3 × 3 grid,
    by playing every action sequence of length H on the NumPy reference."""
    starts = ((np.arange(1, 512)[:, None] >> np.arange(9)) & 1).astype(np.uint8).reshape(-1, 3, 3)
    grids, first = starts, np.full(len(starts), 255)
    for k in range(1, H + 1):
        grids = np.repeat(grids, 9, axis=0)
        first = np.repeat(first, 9)
        actions = np.tile(np.arange(9), len(grids) // 9)
        flipped = grids.reshape(len(grids), 9).copy()
        flipped[np.arange(len(grids)), actions] ^= 1
        stepped = grid_reference.update(flipped.reshape(-1, 3, 3), rule)
        done = first != 255
        grids = np.where(done[:, None, None], 0, stepped).astype(np.uint8)
        first[~done & (grids.reshape(len(grids), -1).sum(axis=1) == 0)] = k
    per_start = 9 ** H
    return (first.reshape(511, per_start).min(axis=1),
            grids.reshape(511, per_start, 9).sum(axis=2).min(axis=1))


@pytest.mark.parametrize("rule", ["B3/S23", "B2/S", "B36/S125", "B1/S12V", "B0/S1V"])
def test_exact_search_matches_brute_force_on_3x3(rule):
    from tapebench.methods.grid_exact import value_layers

    rule = MOORE.rule(rule) if not rule.endswith("V") else VON_NEUMANN.rule(rule)
    H = 3
    W, d = value_layers(rule, rule.family, 3, H)
    first, final = brute_force_optimum(rule, H)
    assert np.array_equal(d[1:], first)
    assert np.array_equal(W[H][1:], final)


def test_exact_feasibility_table_and_its_limit():
    from tapebench.methods.grid_exact import transition_table
    from tapebench.oracle.grid_feasibility import grid_feasibility_table

    frame = grid_feasibility_table(["B/S", "B3/S23"], MOORE, 4, 4)
    dies = frame.iloc[0]
    assert dies["solvable_fraction"] == 1.0 and dies["steps_1"] == 1.0 and dies["min_steps_max"] == 1
    life = frame.iloc[1]
    assert 0 < life["solvable_fraction"] <= 1 and life["optimal_final_dist_mean"] >= 0
    T = transition_table("B3/S23", MOORE, 4)
    rule = MOORE.rule("B3/S23")
    for s in (1, 0b1011_0110_0001_1100, 65535):
        grid = ((s >> np.arange(16)) & 1).astype(np.uint8).reshape(4, 4)
        for a in (0, 7, 15):
            after = grid_reference.transition(grid, a, rule).reshape(-1)
            assert T[s, a] == int((after.astype(np.int64) << np.arange(16)).sum())
    with pytest.raises(ValueError, match="n in 3..4, got n=5"):
        grid_feasibility_table(["B3/S23"], MOORE, 5, 4)


def one_transition(rule, n=3, seed=4, action=4):
    grid = random_grids(1, n, seed=seed)[0]
    return grid, action, grid_reference.transition(grid, action, rule)


def test_rule_set_filter_keeps_exactly_the_rules_that_reproduce_the_transition():
    from tapebench.ca.grid_packed import pack
    from tapebench.methods.grid_bayes_filter import GridBayesFilter

    true = VON_NEUMANN.rule("B1/S12V")
    grid, action, after = one_transition(true)
    bf = GridBayesFilter(range(1024), VON_NEUMANN, 3, seed=0)
    bf.begin([7])
    bf.observe(pack(grid), [action], pack(after), [False])
    flipped = grid_reference.flip(grid, action)
    consistent = {z for z in range(1024) if np.array_equal(grid_reference.update(flipped, VON_NEUMANN.rule(z)), after)}
    kept = set(bf.rules[bf.M[0] == 0].tolist())
    assert kept == consistent and true.id in kept and len(kept) < 1024
    post = bf.posterior()[0]
    assert np.allclose(post[bf.M[0] == 0], post.max()) and (post[bf.M[0] > 0] < post.max() * 0.02).all()


def test_factorised_filter_is_the_enumerated_posterior_over_the_whole_family():
    from tapebench.ca.grid_packed import pack
    from tapebench.methods.grid_bayes_filter import GridBayesFilter, GridBayesFilterFull

    true = VON_NEUMANN.rule("B13/S0V")
    grid, action, after = one_transition(true, seed=5, action=2)
    grid2, action2, after2 = one_transition(true, seed=6, action=7)
    enum = GridBayesFilter(range(1024), VON_NEUMANN, 3)
    full = GridBayesFilterFull(VON_NEUMANN, 3)
    for bf in (enum, full):
        bf.begin([1])
        bf.observe(pack(grid), [action], pack(after), [False])
        bf.observe(pack(grid2), [action2], pack(after2), [False])
    marginal = np.einsum("z,zse->se", enum.posterior()[0], VON_NEUMANN.tables(enum.rules.tolist()).astype(float))
    assert np.allclose(full.entry_probabilities()[0], marginal, atol=1e-12)
    pinned = full.C[0].sum(axis=1).reshape(2, 5) > 0
    assert pinned.any()
    assert np.array_equal(np.round(full.entry_probabilities()[0][pinned]), true.table[pinned])
    assert np.allclose(full.entry_probabilities()[0][~pinned], 0.5)
    # the same action scores: expected live fraction and predictive entropy (nats) of the next grid
    state = pack(random_grids(1, 3, seed=8))[0]
    (s_enum, ig_enum), (s_full, ig_full) = enum.action_scores(state), full.action_scores(state)
    assert np.allclose(s_enum, s_full, atol=1e-9) and np.allclose(ig_enum, ig_full, atol=1e-9)
    assert ig_full.max() > 0


def test_bayes_filters_play_grid_episodes():
    from tapebench.methods.grid_bayes_filter import GridBayesFilter, GridBayesFilterFull, run_grid_bayes_filter

    starts = random_grids(6, 4, seed=9)
    rules = ["B/S", "B3/S23", "B2/S"] * 2
    for make in (lambda: GridBayesFilter(["B/S", "B3/S23", "B2/S", "B36/S23"], MOORE, 4, seed=3),
                 lambda: GridBayesFilterFull(MOORE, 4, seed=3)):
        a = run_grid_bayes_filter(starts, rules, MOORE, 6, make(), keys=np.arange(6) + 11)
        b = run_grid_bayes_filter(starts, rules, MOORE, 6, make(), keys=np.arange(6) + 11)
        assert all(np.array_equal(a[k], b[k]) for k in ("success", "steps", "actions", "return"))
        assert a["success"][[0, 3]].all() and (a["steps"][[0, 3]] == 1).all()
        for i in range(6):
            lives = replay(starts[i], a["actions"][i], MOORE.rule(rules[i]))
            assert len(lives) == a["steps"][i] and a["success"][i] == (lives[-1] == 0)


@pytest.mark.parametrize("rule, n", [("B3678/S34678", 4), ("B3/S012345678", 4), ("B1/S12V", 3)])
def test_exact_controller_reaches_the_goal_in_the_fewest_steps_or_the_least_final_count(rule, n):
    from tapebench.methods.grid_exact import dense_index, run_grid_exact, value_layers

    rule = MOORE.rule(rule) if not rule.endswith("V") else VON_NEUMANN.rule(rule)
    H, starts, cells = 4, random_grids(40, n, seed=10), n * n
    out = run_grid_exact(starts, [rule] * 40, rule.family, H)
    W, d = value_layers(rule, rule.family, n, H)
    s = dense_index(starts)
    solvable = d[s] <= H
    assert np.array_equal(out["success"], solvable)
    assert np.array_equal(out["steps"][solvable], d[s][solvable]) and (out["steps"][~solvable] == H).all()
    assert np.array_equal(np.round(out["final_dist"] * cells).astype(int), np.where(solvable, 0, W[H][s]))
    for i in range(40):
        lives = replay(starts[i], out["actions"][i], rule)
        assert lives[-1] == round(out["final_dist"][i] * cells) and len(lives) == out["steps"][i]
    mpc = run_grid_mpc(starts, [rule] * 40, rule.family, H, config=MPCConfig(4, 64, 0))
    assert (mpc["success"] <= out["success"]).all() and (mpc["final_dist"] >= out["final_dist"] - 1e-12).all()


def test_oracles_refuse_bad_batches_naming_the_argument():
    from tapebench.methods.grid_exact import run_grid_exact

    grids = random_grids(2, 4)
    with pytest.raises(ValueError, match="one rule per start grid"):
        run_grid_mpc(grids, ["B3/S23"], MOORE, 4)
    with pytest.raises(ValueError, match="all-zero goal"):
        run_grid_mpc(np.zeros((1, 4, 4), dtype=np.uint8), ["B3/S23"], MOORE, 4)
    with pytest.raises(ValueError, match="neighbourhood"):
        run_grid_mpc(grids, ["B3/S23", "B1/S1V"], MOORE, 4)
    with pytest.raises(ValueError, match="packed kernel"):
        run_grid_mpc(random_grids(1, 9), ["B3/S23"], MOORE, 4)
    with pytest.raises(ValueError, match="n in 3..4, got n=5"):
        run_grid_exact(random_grids(1, 5), ["B3/S23"], MOORE, 4)
