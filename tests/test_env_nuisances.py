"""Dynamics nuisances of the environment (PPO + DR's domain randomisation, docs/methods.md): the initial
cell density ρ and the cell-update noise ε, in TapeEnv and BatchedTapeEnv.

Exact where the semantics are exact (the noise is the CA update XOR a Bernoulli(ε) mask drawn from the
env's own generator, success and reward judged after it; the defaults keep the original random stream);
statistical, with closed-form tolerances and fixed seeds, where they are distributions."""
from __future__ import annotations

import copy

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tapebench  # noqa: F401  (registers tapebench/Tape-v0)
from tapebench.ca import reference, torch_kernel
from tapebench.envs import ENV_ID
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.tape_env import TapeEnv, initial_tape
from tapebench.training import checkpoint as ckpt

Z = 4.5   # tolerance in standard deviations of the closed-form null distribution (seeds are fixed)


# --- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    (dict(init_density=0.0), r"init_density must be a number in \(0, 1\).*got 0\.0"),
    (dict(init_density=1.0), r"init_density must be a number in \(0, 1\).*got 1\.0"),
    (dict(init_density=-0.2), r"init_density .*got -0\.2"),
    (dict(init_density="0.3"), r"init_density .*got '0\.3'"),
    (dict(init_density=True), r"init_density .*got True"),
    (dict(init_density=float("nan")), r"init_density .*got nan"),
    (dict(noise=0.6), r"noise must be a number in \[0, 0\.5\].*got 0\.6"),
    (dict(noise=-0.01), r"noise must be a number in \[0, 0\.5\].*got -0\.01"),
    (dict(noise=(0.0, 0.1)), r"noise must be a number in \[0, 0\.5\], got \(0\.0, 0\.1\)"),  # no ranges here
])
def test_tape_env_rejects_bad_nuisances(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        TapeEnv(rule=30, L=8, H=8, **kwargs)
    with pytest.raises(ValueError, match=needle):
        gymnasium.make(ENV_ID, rule=30, L=8, H=8, **kwargs)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(init_density=(0.8, 0.2)), r"init_density range must have low <= high, got low 0\.8 > high 0\.2"),
    (dict(init_density=(0.0, 0.5)), r"init_density must be a number in \(0, 1\) or a \(low, high\) range"),
    (dict(init_density=(0.2, 0.5, 0.8)), r"init_density .*got \(0\.2, 0\.5, 0\.8\)"),
    (dict(noise=(0.1, 0.6)), r"noise must be a number in \[0, 0\.5\] or a \(low, high\) range.*got \(0\.1, 0\.6\)"),
    (dict(noise=(0.02, 0.01)), r"noise range must have low <= high"),
    (dict(noise=[0.1]), r"noise .*got \[0\.1\]"),
    (dict(noise=1), r"noise .*got 1"),
])
def test_batched_env_rejects_bad_nuisances(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        BatchedTapeEnv(2, L=8, H=8, **kwargs)


# --- the defaults keep the original random stream and code path ----------------------------------
def test_default_density_draws_the_original_fair_bits():
    goal = np.zeros(32, dtype=np.uint8)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(20):
        assert np.array_equal(initial_tape(a, 32, goal, 0.5), b.integers(0, 2, size=32, dtype=np.uint8))


def test_batched_defaults_draw_exactly_what_the_env_drew_before():
    """reset: fair-bit tapes, then rule indices, from the env generator, nothing else (L = 32: no redraws)."""
    rules = [3, 30, 110]
    env = BatchedTapeEnv(64, L=32, H=4, rules=rules, seed=9, init_density=0.5, noise=0.0)
    env.reset()
    gen = torch.Generator().manual_seed(9)
    tapes = torch.randint(0, 2, (64, 32), generator=gen, dtype=torch.uint8)
    idx = torch.randint(0, 3, (64,), generator=gen)
    assert torch.equal(env.tapes, tapes)
    assert torch.equal(env.rules, torch.tensor(rules, dtype=torch.uint8)[idx])
    assert torch.equal(env.generator.get_state(), gen.get_state())
    assert not env.nuisances and not env.randomised


def trajectory(env, steps: int = 12, seed: int = 0) -> torch.Tensor:
    env.reset()
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(torch.randint(0, env.L, (env.num_envs,), generator=gen))
        rows.append(torch.cat([obs.flatten(), reward, terminated.float(), info["final_obs"].flatten()]))
    return torch.stack(rows)


@pytest.mark.parametrize("explicit", [dict(init_density=0.5, noise=0.0), dict(init_density=(0.5, 0.5), noise=(0, 0))])
def test_explicit_defaults_and_degenerate_ranges_change_nothing(explicit):
    make = lambda **kw: BatchedTapeEnv(32, L=7, H=4, rules=range(256), seed=4, **kw)
    assert torch.equal(trajectory(make()), trajectory(make(**explicit)))
    assert not make(**explicit).nuisances
    tape_a, tape_b = TapeEnv(rules=range(256), L=7, H=4), TapeEnv(rules=range(256), L=7, H=4, init_density=0.5,
                                                                      noise=0.0)
    for seed in range(5):
        assert np.array_equal(tape_a.reset(seed=seed)[0], tape_b.reset(seed=seed)[0])
        for a in (0, 3, 6, 2):
            assert all(np.array_equal(x, y) for x, y in zip(tape_a.step(a)[:4], tape_b.step(a)[:4]))


def test_default_env_state_has_no_nuisance_entries():
    env = BatchedTapeEnv(4, L=8, H=4)
    env.reset()
    assert set(ckpt.env_state(env)) == {"tapes", "rules", "t", "generator"}


# --- initial density -----------------------------------------------------------------------------
def expected_density(rho: float, L: int) -> tuple[float, float]:
    """Mean and variance of the fraction of 1s of one tape: S ~ Bin(L, rho) conditioned on S > 0
    (the all-zero goal is redrawn)."""
    q = 1.0 - (1.0 - rho) ** L
    mean_s = L * rho / q
    second_s = (L * rho * (1.0 - rho) + (L * rho) ** 2) / q
    return mean_s / L, (second_s - mean_s ** 2) / L ** 2


@pytest.mark.parametrize("rho,L", [(0.3, 8), (0.8, 16), (0.2, 32)])
def test_batched_initial_density_matches_rho(rho, L):
    tapes = 20_000
    env = BatchedTapeEnv(tapes, L=L, H=4, seed=1, init_density=rho)
    env.reset()
    mean, var = expected_density(rho, L)
    observed = env.tapes.float().mean().item()
    assert abs(observed - mean) < Z * np.sqrt(var / tapes), (observed, mean)
    assert (env.row_density == np.float32(rho)).all()
    if rho == 0.3:   # L = 8: the redraw of the goal shifts the mean (0.3185), and the test sees it
        assert abs(observed - rho) > Z * np.sqrt(var / tapes)


@pytest.mark.parametrize("rho,L", [(0.3, 8), (0.75, 16)])
def test_tape_env_initial_density_matches_rho(rho, L):
    env = TapeEnv(rule=30, L=L, H=4, init_density=rho)
    env.reset(seed=2)
    tapes = 4000
    observed = np.mean([env.reset()[0][:L].mean() for _ in range(tapes)])
    mean, var = expected_density(rho, L)
    assert abs(observed - mean) < Z * np.sqrt(var / tapes), (observed, mean)


# --- noise ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.01, 0.2])
def test_batched_flip_rate_matches_eps(eps):
    n, L, H, steps = 512, 16, 8, 24
    env = BatchedTapeEnv(n, L=L, H=H, rules=[30, 110, 204, 90], seed=6, noise=eps)
    obs = env.reset()
    gen = torch.Generator().manual_seed(1)
    flips = 0
    for _ in range(steps):
        actions = torch.randint(0, L, (n,), generator=gen)
        clean = torch_kernel.transition(obs[:, :L].to(torch.uint8), actions, env.rules.clone())
        obs, _, _, _, info = env.step(actions)
        flips += int((info["final_obs"][:, :L].to(torch.uint8) != clean).sum())
    cells = n * L * steps
    assert abs(flips / cells - eps) < Z * np.sqrt(eps * (1 - eps) / cells), flips / cells


def test_tape_env_flip_rate_matches_eps():
    eps, L, steps = 0.05, 32, 3000
    env = TapeEnv(rule=110, L=L, H=10 ** 6, noise=eps)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    flips = 0
    for _ in range(steps):
        a = int(rng.integers(L))
        clean = reference.transition(obs[:L].astype(np.uint8), a, 110)
        obs, *_ = env.step(a)
        flips += int((obs[:L].astype(np.uint8) != clean).sum())
    cells = L * steps
    assert abs(flips / cells - eps) < Z * np.sqrt(eps * (1 - eps) / cells), flips / cells


def test_batched_noise_is_the_update_xor_a_bernoulli_mask_and_success_is_judged_after_it():
    """Exact: replay the env generator to know the mask. Rule 0 maps every tape to the goal, so every
    failure of a rule-0 row is the noise's doing."""
    n, L, eps = 64, 8, 0.1
    env = BatchedTapeEnv(n, L=L, H=8, rules=[0, 30, 204], seed=3, noise=eps, success_bonus=1.5)
    obs = env.reset()
    gen = torch.Generator().manual_seed(0)
    noisy_failures = successes = 0
    for _ in range(20):
        tapes, rules = env.tapes.clone(), env.rules.clone()
        replay = torch.Generator()
        replay.set_state(env.generator.get_state())
        mask = (torch.rand(n, L, generator=replay) < eps).to(torch.uint8)
        actions = torch.randint(0, L, (n,), generator=gen)
        expected = torch_kernel.transition(tapes, actions, rules) ^ mask
        obs, reward, terminated, truncated, info = env.step(actions)
        assert torch.equal(info["final_obs"][:, :L].to(torch.uint8), expected)
        dist = expected.float().mean(dim=1)
        assert torch.equal(terminated, dist == 0)
        assert torch.equal(info["dist"], dist)
        assert torch.equal(reward, torch.where(dist == 0, torch.tensor(1.5), -dist))
        noisy_failures += int(((rules == 0) & ~terminated).sum())
        successes += int(terminated.sum())
    assert noisy_failures > 0 and successes > 0


def test_tape_env_noise_is_the_update_xor_a_bernoulli_mask_and_success_is_judged_after_it():
    L, eps = 6, 0.1
    env = TapeEnv(rules=[0, 30], L=L, H=5, noise=eps)
    rng = np.random.default_rng(1)
    outcomes = set()
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            a = int(rng.integers(L))
            replay = copy.deepcopy(env.np_random)
            expected = reference.transition(obs[:L].astype(np.uint8), a, info["rule"]) \
                ^ (replay.random(L) < eps).astype(np.uint8)
            obs, reward, terminated, truncated, info = env.step(a)
            assert np.array_equal(obs[:L], expected)
            assert terminated == (not expected.any())
            assert reward == (1.0 if terminated else -expected.mean())
            outcomes.add((info["rule"], terminated))
            done = terminated or truncated
    assert (0, False) in outcomes and (0, True) in outcomes   # rule 0 fails only through the noise


# --- TapeEnv and BatchedTapeEnv ------------------------------------------------------------------
def test_tape_and_batched_envs_agree_step_for_step_with_rho_set_and_no_noise():
    """ρ only changes how initial tapes are drawn (the two envs draw from different generators, so they
    agree in distribution: see the density tests); from the same loaded tapes they step identically."""
    L, H, rules = 9, 6, [30, 110, 204, 0, 90]
    tapes = np.random.default_rng(4).integers(0, 2, (len(rules), L), dtype=np.uint8)
    tapes[tapes.sum(1) == 0, 0] = 1
    batched = BatchedTapeEnv(len(rules), L=L, H=H, rules=rules, init_density=0.3, noise=0.0, autoreset=False)
    obs = batched.load(tapes, rules)
    envs = [TapeEnv(rule=z, L=L, H=H, init_density=0.3, noise=0.0) for z in rules]
    for env, tape, row in zip(envs, tapes, obs.numpy()):
        assert np.array_equal(env.reset(seed=0, options={"tape": tape})[0], row)
    rng = np.random.default_rng(2)
    finished = set()
    for _ in range(H):
        actions = rng.integers(0, L, len(rules))
        obs, reward, terminated, truncated, _ = batched.step(torch.as_tensor(actions))
        for i, (env, a) in enumerate(zip(envs, actions)):
            if i in finished:   # the batched env without auto-reset keeps stepping finished rows
                continue
            t_obs, t_reward, t_term, t_trunc, _ = env.step(int(a))
            assert np.array_equal(obs[i].numpy(), t_obs)
            assert reward[i].item() == np.float32(t_reward)
            assert (bool(terminated[i]), bool(truncated[i])) == (t_term, t_trunc)
            if t_term or t_trunc:
                finished.add(i)
    assert 3 in finished   # rule 0 succeeds at once


# --- per-row ranges (domain randomisation) --------------------------------------------------------
def test_per_row_ranges_are_drawn_at_reset_and_used_by_each_row():
    n, L = 2048, 32
    env = BatchedTapeEnv(n, L=L, H=8, rules=[204], seed=2, init_density=(0.2, 0.8), noise=(0.0, 0.02))
    env.reset()
    rho, eps = env.row_density.numpy().astype(np.float64), env.row_noise.numpy().astype(np.float64)
    assert env.randomised and env.nuisances
    assert rho.min() >= 0.2 and rho.max() < 0.8 and rho.min() < 0.22 and rho.max() > 0.78
    assert eps.min() >= 0.0 and eps.max() < 0.02 and eps.min() < 0.001 and eps.max() > 0.019
    assert len(np.unique(rho)) > n - 5 and len(np.unique(eps)) > n - 5
    # each row's tape is drawn with its own rho: regression slope of tape density on rho is 1
    density = env.tapes.double().mean(dim=1).numpy()
    slope = np.cov(rho, density)[0, 1] / rho.var(ddof=1)
    residual = np.sqrt(np.mean(rho * (1 - rho)) / L)
    assert abs(slope - 1.0) < Z * residual / (np.sqrt(n) * rho.std()), slope
    # ... and flips with its own epsilon (rule 204 is the identity: only the action and the noise change a tape)
    flips, steps = np.zeros(n), 7
    for step in range(steps):
        before = env.tapes.clone()
        actions = torch.zeros(n, dtype=torch.long)
        env.step(actions)
        after = env.tapes.clone()
        clean = torch_kernel.flip(before, actions)
        flips += (after != clean).sum(dim=1).numpy()
    assert np.array_equal(env.row_noise.numpy().astype(np.float64), eps)   # no row ended (H = 8)
    rate = flips / (L * steps)
    slope = np.cov(eps, rate)[0, 1] / eps.var(ddof=1)
    residual = np.sqrt(np.mean(eps * (1 - eps)) / (L * steps))
    assert abs(slope - 1.0) < Z * residual / (np.sqrt(n) * eps.std()), slope


def test_per_row_ranges_are_redrawn_at_auto_reset_only():
    """Rule 0 rows reach the goal in one step (unless the noise spoils it); rule 204 rows run to H."""
    n, L = 256, 16
    env = BatchedTapeEnv(n, L=L, H=3, rules=[0, 204], seed=5, init_density=(0.3, 0.7), noise=(0.0, 0.05))
    env.reset()
    for _ in range(6):
        rho, eps = env.row_density.clone(), env.row_noise.clone()
        _, _, terminated, truncated, _ = env.step(torch.randint(0, L, (n,)))
        done = terminated | truncated
        assert 0 < int(done.sum()) < n or bool(truncated.any())
        assert torch.equal(env.row_density[~done], rho[~done]) and torch.equal(env.row_noise[~done], eps[~done])
        assert (env.row_density[done] != rho[done]).all() and (env.row_noise[done] != eps[done]).all()
        assert ((env.row_density >= 0.3) & (env.row_density < 0.7)).all()
        assert ((env.row_noise >= 0.0) & (env.row_noise < 0.05)).all()


def test_resume_state_with_ranges_continues_bit_identically():
    kwargs = dict(L=8, H=4, rules=[0, 30, 204], init_density=(0.2, 0.8), noise=(0.0, 0.1))
    a = BatchedTapeEnv(16, seed=1, **kwargs)
    a.reset()
    gen = torch.Generator().manual_seed(3)
    actions = [torch.randint(0, 8, (16,), generator=gen) for _ in range(27)]
    for act in actions[:7]:
        a.step(act)
    state = ckpt.env_state(a)
    assert {"init_density", "noise"} <= set(state)
    b = BatchedTapeEnv(16, seed=99, **kwargs)
    b.reset()
    ckpt.load_env_state(b, state)
    assert torch.equal(a.row_density, b.row_density) and torch.equal(a.row_noise, b.row_noise)
    for act in actions[7:]:
        out_a, out_b = a.step(act), b.step(act)
        for x, y in zip(out_a[:4], out_b[:4]):
            assert torch.equal(x, y)
        assert torch.equal(out_a[4]["final_obs"], out_b[4]["final_obs"])
        assert torch.equal(a.row_density, b.row_density) and torch.equal(a.row_noise, b.row_noise)
    with pytest.raises(ValueError, match="no per-row init_density/noise"):
        ckpt.load_env_state(b, {k: v for k, v in state.items() if k not in ("init_density", "noise")})


# --- Gymnasium -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(rule=30, L=16, H=16, init_density=0.3, noise=0.01),
    dict(rules=[0, 4, 110], L=5, H=4, init_density=0.9, noise=0.5),
])
def test_gymnasium_make_with_nuisances_passes_env_checker(kwargs):
    env = gymnasium.make(ENV_ID, **kwargs)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert env.unwrapped.init_density == kwargs["init_density"] and env.unwrapped.noise == kwargs["noise"]
