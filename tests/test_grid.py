"""The 2D grid family (docs/protocol.md#grid): Golly notation and rule ids, the NumPy reference against a
per-cell loop and known patterns, the packed numba and torch kernels bit-exact against the reference, and the
Gymnasium / batched environments following the kernel step for step."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tapebench  # noqa: F401  (registers the Gymnasium ids)
from tapebench.ca import grid_packed, grid_reference, grid_torch
from tapebench.cli import main
from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.envs.grid_env import GridEnv
from tapebench.envs.tape_env import TapeEnv
from tapebench.grid_rules import MOORE, VON_NEUMANN, GridFamily, parse_rule

FAMILIES = (MOORE, VON_NEUMANN)
GLIDER = np.array([[0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=np.uint8)   # moves one cell down and right every 4 steps


def place(pattern: np.ndarray, n: int, row: int = 0, col: int = 0) -> np.ndarray:
    grid = np.zeros((n, n), dtype=np.uint8)
    grid[row:row + pattern.shape[0], col:col + pattern.shape[1]] = pattern
    return grid


def random_rules(family: GridFamily, count: int, rng) -> list:
    return [family.rule(int(i)) for i in rng.integers(0, family.num_rules, count)]


def loop_step(grid: np.ndarray, rule) -> np.ndarray:
    """The physics cell by cell, written independently of the reference."""
    n = grid.shape[0]
    out = np.zeros_like(grid)
    for i in range(n):
        for j in range(n):
            count = sum(int(grid[(i + dr) % n, (j + dc) % n]) for dr in (-1, 0, 1) for dc in (-1, 0, 1)
                        if (dr, dc) != (0, 0) and (rule.family.neighbours == 8 or dr * dc == 0))
            out[i, j] = (count in rule.survival) if grid[i, j] else (count in rule.birth)
    return out


# --- rules: notation, ids, refusals ----------------------------------------------------------------------------

def test_notation_and_ids():
    life = parse_rule("B3/S23")
    assert life.family == MOORE and life.birth == {3} and life.survival == {2, 3}
    assert life.id == 2 ** 3 + 2 ** (9 + 2) + 2 ** (9 + 3) == 6152
    assert MOORE.rule(6152) == life and str(MOORE.rule(6152)) == "B3/S23"
    vn = parse_rule("B1/S12V")
    assert vn.family == VON_NEUMANN and vn.id == 2 ** 1 + 2 ** (5 + 1) + 2 ** (5 + 2) and str(vn) == "B1/S12V"
    assert parse_rule("b63/s32") == parse_rule("B36/S23") and str(parse_rule("b63/s32")) == "B36/S23"
    assert parse_rule("B/S").id == 0 and str(MOORE.rule(MOORE.num_rules - 1)) == "B012345678/S012345678"
    assert (MOORE.num_rules, VON_NEUMANN.num_rules) == (2 ** 18, 2 ** 10)
    assert [VON_NEUMANN.rule(str(VON_NEUMANN.rule(i))).id for i in range(VON_NEUMANN.num_rules)] == \
        list(range(VON_NEUMANN.num_rules))
    for i in np.random.default_rng(0).integers(0, MOORE.num_rules, 200).tolist():
        rule = MOORE.rule(i)
        assert parse_rule(str(rule)).id == i
        assert (rule.table.reshape(-1) == [(i >> k) & 1 for k in range(18)]).all()   # id = Σ T[s, c] 2^(9s + c)


@pytest.mark.parametrize("bad, message", [
    ("B9/S2", r"B counts of the moore neighbourhood must be in 0..8, got \[9\]"),
    ("B5/S2V", r"B counts of the von_neumann neighbourhood must be in 0..4, got \[5\]"),
    ("B3/S23X", "is not Golly notation"),
    ("", "is not Golly notation"),
    ("B33/S23", r"B lists \[3\] more than once"),
    ("S23/B3", "is not Golly notation"),
    (23, "must be a string in Golly notation"),
])
def test_bad_notation_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_rule(bad)


@pytest.mark.parametrize("family, bad", [(MOORE, 2 ** 18), (MOORE, -1), (VON_NEUMANN, 1024), (MOORE, True),
                                         (MOORE, 3.0)])
def test_ids_out_of_range_are_refused(family, bad):
    with pytest.raises(ValueError, match=rf"must be an integer in 0..{family.num_rules - 1}, got {bad!r}"):
        family.rule(bad)


def test_a_rule_of_the_other_neighbourhood_is_refused():
    with pytest.raises(ValueError, match="has the von_neumann neighbourhood, but the moore"):
        MOORE.rule("B1/S12V")
    with pytest.raises(ValueError, match="neighbourhood must be 'moore' or 'von_neumann', got 'hex'"):
        GridFamily("hex")


# --- kernels -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_reference_agrees_with_a_per_cell_loop(family):
    rng = np.random.default_rng(1)
    for rule, n in zip(random_rules(family, 12, rng), (3, 4, 5, 7, 8, 9) * 2):
        grid = rng.integers(0, 2, (n, n), dtype=np.uint8)
        assert np.array_equal(grid_reference.ca_step(grid, rule), loop_step(grid, rule)), (str(rule), n)


def all_kernels(grid: np.ndarray, rule, steps: int) -> list[np.ndarray]:
    """(steps + 1, n, n) trajectories of the reference, the packed kernel (n <= 8) and the torch kernel."""
    n, moore = grid.shape[0], rule.family.neighbours == 8
    words, tensor = grid_packed.pack(grid), torch.from_numpy(grid[None].copy())
    tables = torch.from_numpy(rule.table.reshape(1, -1).copy())
    runs = {"reference": [grid], "packed": [grid], "torch": [grid]}
    for _ in range(steps):
        runs["reference"].append(grid_reference.ca_step(runs["reference"][-1], rule))
        words = grid_packed.step_words(words, rule.id, n, moore)
        runs["packed"].append(grid_packed.unpack(words, n)[0])
        tensor = grid_torch.ca_step(tensor, tables, rule.family)
        runs["torch"].append(tensor[0].numpy())
    return [np.stack(run) for run in runs.values()]


@pytest.mark.parametrize("n", [5, 8])
def test_a_glider_moves_one_cell_diagonally_every_four_steps(n):
    life = parse_rule("B3/S23")
    for trajectory in all_kernels(place(GLIDER, n), life, 4 * n):
        for step in range(0, 4 * n + 1, 4):
            assert np.array_equal(trajectory[step], np.roll(place(GLIDER, n), (step // 4, step // 4), axis=(0, 1)))
        assert trajectory[1:4].sum(axis=(1, 2)).tolist() == [5, 5, 5]


def test_a_blinker_has_period_two():
    life, n = parse_rule("B3/S23"), 6
    horizontal = place(np.ones((1, 3), dtype=np.uint8), n, 2, 1)
    for trajectory in all_kernels(horizontal, life, 6):
        assert np.array_equal(trajectory[1], horizontal.T) and not np.array_equal(trajectory[1], horizontal)
        assert all(np.array_equal(trajectory[t], trajectory[t % 2]) for t in range(7))


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_and_torch_kernels_are_bit_exact_on_random_rules(family):
    rng = np.random.default_rng(2)
    for n in (3, 4, 5, 6, 7, 8):
        count = 64
        rules = random_rules(family, count, rng)
        ids = np.array([rule.id for rule in rules], dtype=np.int64)
        grids = rng.integers(0, 2, (count, n, n), dtype=np.uint8)
        words, tensor = grid_packed.pack(grids), torch.from_numpy(grids)
        tables = torch.from_numpy(family.tables(rules).reshape(count, -1))
        for _ in range(24):
            actions = rng.integers(0, n * n, count)
            grids = np.stack([grid_reference.transition(g, int(a), r) for g, a, r in zip(grids, actions, rules)])
            words = grid_packed.transition_words(words, actions, ids, n, family.neighbours == 8)
            tensor = grid_torch.transition(tensor, torch.from_numpy(actions), tables, family)
            assert np.array_equal(grid_packed.unpack(words, n), grids) and np.array_equal(tensor.numpy(), grids)
        stepped = grid_packed.step_words_rules(words, ids, n, family.neighbours == 8)
        assert np.array_equal(grid_packed.unpack(stepped, n),
                              np.stack([grid_reference.ca_step(g, r) for g, r in zip(grids, rules)]))
        rule = rules[0]
        evolved = grid_packed.evolve_words(words, rule.id, n, family.neighbours == 8, 5)
        assert np.array_equal(grid_packed.unpack(evolved, n), grid_reference.rollout(grids, rule, 5)[-1])


def test_torch_kernel_on_grids_larger_than_a_word():
    rng = np.random.default_rng(3)
    for family, n in ((MOORE, 13), (VON_NEUMANN, 32)):
        rules = random_rules(family, 8, rng)
        grids = rng.integers(0, 2, (8, n, n), dtype=np.uint8)
        tensor = torch.from_numpy(grids)
        tables = torch.from_numpy(family.tables(rules).reshape(8, -1))
        for _ in range(8):
            grids = np.stack([grid_reference.ca_step(g, r) for g, r in zip(grids, rules)])
            tensor = grid_torch.ca_step(tensor, tables, family)
            assert np.array_equal(tensor.numpy(), grids)


def test_the_packed_layout_and_its_limits():
    grid = np.zeros((8, 8), dtype=np.uint8)
    grid[2, 5] = 1
    assert grid_packed.pack(grid)[0] == np.uint64(1 << 21)   # cell (r, c) at bit 8r + c
    with pytest.raises(ValueError, match="grid side n of the packed kernel .* must be an integer in 3..8, got 9"):
        grid_packed.pack(np.zeros((9, 9)))


# --- environments --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["B3/S23", "B1/S12V"])
def test_gymnasium_make_passes_the_env_checker(rule):
    env = gymnasium.make("tapebench/Grid-v0", rule=rule, n=8, H=32)
    assert env.observation_space.shape == (65,) and env.action_space.n == 64
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("family, n", [(MOORE, 8), (VON_NEUMANN, 5), (MOORE, 11)])
def test_the_env_follows_the_reference_over_random_episodes(family, n):
    rng = np.random.default_rng(4)
    rules = random_rules(family, 6, rng)
    env = GridEnv(rules=rules, n=n, H=12)
    for episode in range(6):
        obs, info = env.reset(seed=episode)
        rule = env.rule
        assert info["rule"] == str(rule) and info["rule_id"] == rule.id and rule in rules
        grid = obs[:-1].reshape(n, n).astype(np.uint8)
        for t in range(1, 13):
            action = int(rng.integers(n * n))
            grid = grid_reference.transition(grid, action, rule)
            obs, reward, terminated, truncated, info = env.step(action)
            dist = grid.mean()
            assert np.array_equal(obs[:-1], grid.reshape(-1)) and obs[-1] == np.float32(t / 12)
            assert info["dist"] == dist and terminated == (dist == 0) and truncated == (dist > 0 and t == 12)
            assert reward == (1.0 if dist == 0 else -dist)
            if terminated or truncated:
                break


def test_action_order_row_major_then_the_post_flip_update():
    n = 5
    keep = GridEnv(rule="B/S012345678", n=n, H=4)   # no birth, every live cell survives: only the flip acts
    obs, _ = keep.reset(seed=0)
    grid = obs[:-1].reshape(n, n).copy()
    grid[2, 3] = 1 - grid[2, 3]
    assert np.array_equal(keep.step(2 * n + 3)[0][:-1].reshape(n, n), grid)
    # B1/S: a lone cell dies and its 8 neighbours are born, read from the post-flip grid
    env = GridEnv(rule="B1/S", n=n, H=4)
    env.reset(options={"grid": place(np.ones((1, 1), dtype=np.uint8), n, 0, 0)})
    obs, reward, terminated, *_ = env.step(0)       # the flip empties the grid: the update keeps it empty
    assert not obs[:-1].any() and terminated and reward == 1.0
    env.reset(options={"grid": place(np.ones((1, 1), dtype=np.uint8), n, 0, 0)})
    obs, reward, terminated, truncated, _ = env.step(n * n - 1)   # flip (4, 4): two live diagonal neighbours
    # both die (S empty); born: the cells with exactly one of them as neighbour, 5 around each ((0, 4) and (4, 0)
    # see both); an update read from the pre-flip grid would give the 8 neighbours of (0, 0)
    expected = np.zeros((n, n), dtype=np.uint8)
    for r, c in ((0, 0), (4, 4)):
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                expected[(r + dr) % n, (c + dc) % n] += 1
    expected = ((expected == 1) & (place(np.ones((1, 1), dtype=np.uint8), n, 0, 0) == 0)).astype(np.uint8)
    expected[4, 4] = 0
    assert expected.sum() == 10 and np.array_equal(obs[:-1].reshape(n, n), expected)
    assert not terminated and reward == pytest.approx(-10 / 25)


def test_success_bonus_and_truncation():
    env = GridEnv(rule="B/S", n=4, H=3, success_bonus=5.0)   # everything dies
    env.reset(seed=1)
    assert env.step(0)[1:4] == (5.0, True, False)
    env = GridEnv(rule="B/S012345678", n=4, H=2)
    env.reset(options={"grid": np.ones((4, 4), dtype=np.uint8)})
    assert env.step(0)[2:4] == (False, False) and env.step(1)[2:4] == (False, True)


def test_the_initial_grid_is_drawn_like_a_tape():
    grid_obs = GridEnv(n=8).reset(seed=7)[0]
    tape_obs = TapeEnv(rule=30, L=64).reset(seed=7)[0]
    assert np.array_equal(grid_obs, tape_obs) and np.array_equal(GridEnv(n=8).reset(seed=7)[0], grid_obs)


@pytest.mark.parametrize("kwargs, message", [
    ({"rule": "B9/S2"}, r"got \[9\]"),
    ({"rule": "B5/S2V"}, r"must be in 0..4, got \[5\]"),
    ({"rule": "B3/S23X"}, "not Golly notation"),
    ({"rule": ""}, "not Golly notation"),
    ({"rule": 2 ** 18}, r"0..262143, got 262144"),
    ({"rule": 1024, "neighbourhood": "von_neumann"}, r"0..1023, got 1024"),
    ({"rule": "B3/S23", "neighbourhood": "von_neumann"}, "has the moore neighbourhood"),
    ({"rules": ["B3/S23", "B1/S12V"]}, "has the von_neumann neighbourhood, but the moore"),
    ({"rules": []}, "at least one rule"),
    ({"n": 2}, r"grid side n must be an integer in 3..32, got 2"),
    ({"n": 33}, r"grid side n must be an integer in 3..32, got 33"),
    ({"n": 8.0}, r"grid side n must be an integer"),
    ({"H": 0}, r"horizon H must be >= 1, got 0"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gymnasium.make("tapebench/Grid-v0", **kwargs)


def test_bad_actions_and_options_are_refused():
    env = GridEnv(n=4)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"cell index in 0..15, got 16"):
        env.step(16)
    with pytest.raises(ValueError, match="with a live cell"):
        env.reset(options={"grid": np.zeros((4, 4))})
    with pytest.raises(ValueError, match=r"cells must be 0 or 1, got values \[2\]"):
        env.reset(options={"grid": np.full((4, 4), 2)})


@pytest.mark.parametrize("family, n", [(MOORE, 8), (VON_NEUMANN, 6)])
def test_the_batched_env_matches_the_gymnasium_env_step_for_step(family, n):
    rng = np.random.default_rng(5)
    rules = random_rules(family, 8, rng)
    N, H = 8, 6
    benv = BatchedGridEnv(N, n=n, H=H, rules=rules, autoreset=False)
    envs = [GridEnv(rules=rules, n=n, H=H) for _ in range(N)]
    starts = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    obs = benv.load(np.stack([s[:-1].reshape(n, n) for s in starts]), [env.rule for env in envs])
    assert np.array_equal(obs.numpy(), np.stack(starts))
    for _ in range(H):
        actions = rng.integers(0, n * n, N)
        obs, reward, terminated, truncated, info = benv.step(torch.from_numpy(actions))
        for row, (env, action) in enumerate(zip(envs, actions)):
            o, r, te, tr, i = env.step(int(action))
            assert np.array_equal(obs[row].numpy(), o) and reward[row].item() == pytest.approx(r, abs=1e-6)
            assert (terminated[row].item(), truncated[row].item()) == (te, tr) and info["rule"][row] == i["rule_id"]
            assert info["dist"][row].item() == pytest.approx(i["dist"], abs=1e-7)


def test_the_batched_env_auto_resets_and_is_seeded():
    env = BatchedGridEnv(16, n=4, H=3, rules=["B3/S23", "B36/S23"], seed=3)
    first = env.reset()
    assert torch.equal(BatchedGridEnv(16, n=4, H=3, rules=["B3/S23", "B36/S23"], seed=3).reset(), first)
    assert (first[:, :-1].sum(dim=1) > 0).all() and set(env.rules.tolist()) <= {6152, 6216}
    for t in range(3):
        obs, _, terminated, truncated, info = env.step(torch.zeros(16, dtype=torch.long))
    assert truncated.any() or terminated.any()
    done = terminated | truncated
    assert (obs[done, -1] == 0).all() and torch.equal(obs[~done], info["final_obs"][~done])
    assert torch.equal(info["final_obs"][:, -1], (info["t"] / 3).float()) and (obs[done, :-1].sum(dim=1) > 0).all()
    with pytest.raises(ValueError, match=r"cell indices in 0..15 \(row-major\), got range 1..16"):
        env.step(torch.arange(17)[1:])


def test_bench_grid_runs_and_checks_the_kernels(capsys):
    assert main(["bench", "grid", "--seconds", "0.01", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "B3/S23" in out and "B1/S12V" in out and "packed / numpy" in out


def test_the_batched_env_draws_like_the_batched_tape_env():
    """Grids then rules from one CPU generator, as `BatchedTapeEnv` draws tapes then rules: n = 8 grids are the
    tapes of length 64 under the same seed."""
    from tapebench.envs.batched import BatchedTapeEnv

    grids = BatchedGridEnv(32, n=8, H=4, rules=["B3/S23"], seed=11).reset()
    tapes = BatchedTapeEnv(32, L=64, H=4, rules=[30], seed=11).reset()
    assert torch.equal(grids[:, :-1], tapes[:, :-1])
