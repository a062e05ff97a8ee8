"""RAD-DQN (`agents/rad_dqn.py`) and the shared augmentations (`agents/augment.py`).

* the circular shift of state *and* action is an exact symmetry of the task: checked with the reference
  CA kernel for all 256 rules, all actions, all shifts, and through `BatchedTapeEnv` (tape, reward,
  termination);
* the replay-batch augmentation shifts obs / next_obs / action consistently, keeps t/H, reward and
  termination, and bit-flips only observation tape cells at the configured rate;
* on the 2D grid family the shift is a translation of the n x n torus (a 2-D roll of the grid, not a roll of the
  flattened vector), a symmetry of the grid env as well, and the agent built for a grid augments that way;
* the agent learns rule 4 at L = H = 16 like DQN, resumes bit-identically after SIGKILL, and its
  evaluation policy is greedy on the raw observation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success

from tapebench.ca import reference
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.grid_rules import MOORE, parse_rule
from tapebench.methods import augment
from tapebench.methods.contract import EnvSpec
from tapebench.registry import build_config, get_method, make_agent

AGENT = "rad_dqn"


def obs_of(tapes: np.ndarray, t_over_h) -> torch.Tensor:
    tapes = torch.as_tensor(tapes, dtype=torch.float32)
    return torch.cat([tapes, torch.as_tensor(t_over_h, dtype=torch.float32).reshape(-1, 1)], dim=1)


# --- the shift is a symmetry of the task -----------------------------------------------------------

def test_shift_of_state_and_action_commutes_with_the_reference_step_for_every_rule():
    L = 7
    rng = np.random.default_rng(0)
    tapes = rng.integers(0, 2, (3, L)).astype(np.uint8)
    for tape in tapes:
        for k in range(L):  # the augmentation's roll is numpy's roll
            shifted = augment.shift_tapes(obs_of(tape[None], [0.5]), torch.tensor([k]), L)[0, :L]
            assert np.array_equal(shifted.numpy().astype(np.uint8), np.roll(tape, k))
        for z in range(256):
            for a in range(L):
                successor = reference.transition(tape, a, z)
                for k in range(L):
                    a_shifted = int(augment.shift_actions(torch.tensor(a), torch.tensor(k), L))
                    assert np.array_equal(reference.transition(np.roll(tape, k), a_shifted, z),
                                          np.roll(successor, k)), (tape, z, a, k)


def test_shift_of_state_and_action_commutes_with_the_batched_env():
    L = H = 8
    z, a, k = (g.ravel() for g in np.meshgrid(np.arange(256), np.arange(L), np.arange(L), indexing="ij"))
    n = len(z)
    tapes = np.random.default_rng(1).integers(0, 2, (n, L)).astype(np.uint8)
    tapes[::97] = 0
    tapes[::97, 0] = 1                      # some one-hot tapes: many (rule, action) pairs succeed at once
    shifts = torch.as_tensor(k)
    plain = BatchedTapeEnv(n, L=L, H=H, rules=list(range(256)), autoreset=False)
    moved = BatchedTapeEnv(n, L=L, H=H, rules=list(range(256)), autoreset=False)
    plain.load(tapes, z)
    moved.load(augment.shift_tapes(obs_of(tapes, np.zeros(n)), shifts, L)[:, :L].to(torch.uint8), z)
    for step in range(3):  # a few steps, so t/H moves and terminations happen after the first step too
        actions = torch.as_tensor(np.random.default_rng(step).integers(0, L, n))
        obs, reward, terminated, truncated, _ = plain.step(actions)
        obs_m, reward_m, terminated_m, truncated_m, _ = moved.step(augment.shift_actions(actions, shifts, L))
        assert torch.equal(obs_m, augment.shift_tapes(obs, shifts, L))     # tape rolled, t/H equal
        assert torch.equal(reward_m, reward)
        assert torch.equal(terminated_m, terminated) and torch.equal(truncated_m, truncated)
        assert 0 < int(terminated.sum()) < n   # both outcomes occur: the check is not vacuous


# --- the replay-batch augmentation ----------------------------------------------------------------

def tracer_batch(n: int, L: int):
    """obs tape = one-hot at the action, next_obs tape = one-hot at action + 2 (a shift keeps both links);
    obs's t/H = row / n identifies the row after sampling (t/H is never augmented)."""
    actions = torch.randint(0, L, (n,))
    cells = torch.arange(L)
    obs = obs_of((cells == actions[:, None]).numpy(), torch.arange(n) / n)
    next_obs = obs_of((cells == ((actions + 2) % L)[:, None]).numpy(), torch.rand(n))
    return obs, actions, -torch.rand(n), next_obs, (torch.rand(n) < 0.3).float()


def test_shift_moves_obs_next_obs_and_action_together_and_keeps_the_rest():
    L, n = 16, 4096
    torch.manual_seed(0)
    obs, actions, rewards, next_obs, terminated = tracer_batch(n, L)
    out_obs, out_actions, out_rewards, out_next, out_terminated = augment.augment_transitions(
        obs, actions, rewards, next_obs, terminated, L=L, shift=True, flip_prob=0.0)
    assert torch.equal(out_obs[:, :L].argmax(1), out_actions)
    assert torch.equal(out_next[:, :L].argmax(1), (out_actions + 2) % L)
    assert torch.equal(out_obs[:, :L].sum(1), torch.ones(n)) and torch.equal(out_next[:, :L].sum(1), torch.ones(n))
    assert torch.equal(out_obs[:, L], obs[:, L]) and torch.equal(out_next[:, L], next_obs[:, L])
    assert torch.equal(out_rewards, rewards) and torch.equal(out_terminated, terminated)
    shifts = (out_actions - actions) % L
    counts = torch.bincount(shifts, minlength=L).float()
    assert counts.min() > 0.7 * n / L and counts.max() < 1.3 * n / L      # k ~ U{0..L-1}
    # inputs untouched
    assert torch.equal(obs[:, :L].argmax(1), actions)


def test_shift_with_explicit_shifts_is_a_per_row_roll():
    L = 8
    tapes = np.random.default_rng(3).integers(0, 2, (5, L))
    obs = obs_of(tapes, [0.0, 0.25, 0.5, 0.75, 1.0])
    shifts = torch.tensor([0, 1, 3, 7, 5])
    out = augment.shift_tapes(obs, shifts, L)
    for row, k in enumerate(shifts.tolist()):
        assert np.array_equal(out[row, :L].numpy(), np.roll(tapes[row], k))
    assert torch.equal(out[:, L], obs[:, L])
    assert torch.equal(augment.shift_actions(torch.tensor([0, 7, 6, 1, 3]), shifts, L), torch.tensor([0, 0, 1, 0, 0]))


def test_bit_flip_touches_only_observation_tape_cells_at_the_configured_rate():
    L, n, p = 32, 4096, 0.05
    torch.manual_seed(1)
    obs, actions, rewards, next_obs, terminated = tracer_batch(n, L)
    out_obs, out_actions, out_rewards, out_next, out_terminated = augment.augment_transitions(
        obs, actions, rewards, next_obs, terminated, L=L, shift=False, flip_prob=p)
    changed = out_obs[:, :L] != obs[:, :L]
    assert torch.equal(out_obs[:, :L][changed], 1.0 - obs[:, :L][changed])     # a change is a flip
    rate = changed.float().mean().item()
    assert abs(rate - p) < 4 * (p * (1 - p) / (n * L)) ** 0.5, rate
    assert torch.equal(out_obs[:, L], obs[:, L])                                 # t/H untouched
    assert torch.equal(out_next, next_obs) and torch.equal(out_actions, actions)
    assert torch.equal(out_rewards, rewards) and torch.equal(out_terminated, terminated)
    off = augment.augment_transitions(obs, actions, rewards, next_obs, terminated, L=L, shift=False, flip_prob=0.0)
    assert torch.equal(off[0], obs)


def test_the_agent_augments_its_minibatches_and_each_augmentation_can_be_switched_off():
    L, n = 16, 512
    spec = EnvSpec.for_tape(L, L)
    for shift, flip_prob in [(True, 0.0), (False, 0.0), (True, 0.05), (False, 0.05)]:
        torch.manual_seed(2)
        agent = make_agent(AGENT, build_config(AGENT, {"shift": shift, "flip_prob": flip_prob, "batch_size": n}),
                           spec, 1000, "cpu")
        obs, actions, rewards, next_obs, terminated = tracer_batch(n, L)
        agent.observe(obs, actions, rewards, next_obs, terminated.bool(), torch.zeros(n, dtype=torch.bool))
        b_obs, b_actions, b_rewards, b_next, _ = agent.sample_batch()
        rows = (b_obs[:, L] * n).round().long()                       # which stored transition each one is
        assert torch.equal(b_next[:, :L].argmax(1), (b_actions + 2) % L)   # next_obs and action moved together
        assert torch.equal(b_rewards, rewards[rows])
        shifts = (b_actions - actions[rows]) % L
        assert (shifts != 0).float().mean().item() > 0.8 if shift else bool((shifts == 0).all())
        flipped = (b_obs[:, :L] != (torch.arange(L) == b_actions[:, None]).float()).float().mean().item()
        assert (flipped == 0.0) == (flip_prob == 0.0) and flipped < 2 * flip_prob + 1e-9


# --- the torus: a 2-D translation --------------------------------------------------------------------

def test_on_the_grid_the_shift_is_a_2d_torus_roll_not_a_flat_roll():
    n = 4
    L = n * n
    labels = np.tile(np.arange(L), (L, 1))          # distinct cell values: the shift is read as a permutation
    shifts = torch.arange(L)                        # every translation k = dy * n + dx
    out = augment.shift_tapes(obs_of(labels, torch.rand(L)), shifts, L, grid=n)[:, :L].numpy()
    for k in range(L):
        dy, dx = divmod(k, n)
        assert np.array_equal(out[k], np.roll(labels[k].reshape(n, n), (dy, dx), axis=(0, 1)).reshape(-1))
        # a flat roll of the vector is the same permutation only for whole-row shifts (dx = 0)
        assert np.array_equal(out[k], np.roll(labels[k], k)) == (dx == 0), k
    actions = torch.tensor([0, 3, 12, 15, 5])
    moved = augment.shift_actions(actions, torch.tensor([1, 1, 4, 5, 7]), L, grid=n)
    assert moved.tolist() == [1, 0, 0, 0, 8]          # (0,3) + (0,1) wraps to (0,0), not to (1,0) = 4 as a flat roll
    assert augment.shift_actions(torch.tensor(3), torch.tensor(1), L).item() == 4


def test_the_torus_shift_of_state_and_action_commutes_with_the_grid_env():
    n, H = 4, 4
    L = n * n
    rules = [parse_rule(r).id for r in ("B3/S23", "B36/S23", "B2/S", "B1/S012345678")]
    z, k = (g.ravel() for g in np.meshgrid(rules, np.arange(L), indexing="ij"))
    count = len(z)
    grids = np.random.default_rng(5).integers(0, 2, (count, L)).astype(np.uint8)
    shifts = torch.as_tensor(k)
    plain = BatchedGridEnv(count, n=n, H=H, rules=rules, neighbourhood="moore", autoreset=False)
    moved = BatchedGridEnv(count, n=n, H=H, rules=rules, neighbourhood="moore", autoreset=False)
    plain.load(grids.reshape(-1, n, n), z)
    moved.load(augment.shift_tapes(obs_of(grids, np.zeros(count)), shifts, L, n)[:, :L].to(torch.uint8).view(-1, n, n),
               z)
    flat = augment.shift_tapes(obs_of(grids, np.zeros(count)), shifts, L)
    for step in range(3):
        actions = torch.as_tensor(np.random.default_rng(step).integers(0, L, count))
        obs, reward, terminated, truncated, _ = plain.step(actions)
        obs_m, reward_m, terminated_m, truncated_m, _ = moved.step(augment.shift_actions(actions, shifts, L, n))
        assert torch.equal(obs_m, augment.shift_tapes(obs, shifts, L, n))
        assert torch.equal(reward_m, reward) and torch.equal(terminated_m, terminated)
    flat_env = BatchedGridEnv(count, n=n, H=H, rules=rules, neighbourhood="moore", autoreset=False)
    flat_env.load(flat[:, :L].to(torch.uint8).view(-1, n, n), z)
    plain.load(grids.reshape(-1, n, n), z)
    actions = augment.shift_actions(torch.zeros(count, dtype=torch.long), shifts, L)
    obs_f = flat_env.step(actions)[0]
    assert not torch.equal(obs_f, augment.shift_tapes(plain.step(torch.zeros(count, dtype=torch.long))[0], shifts, L))


def test_the_agent_built_for_a_grid_translates_the_torus():
    n, count = 4, 512
    L = n * n
    torch.manual_seed(6)
    agent = make_agent(AGENT, build_config(AGENT, {"flip_prob": 0.0, "batch_size": count, "hidden_size": 16}),
                       EnvSpec.for_grid(n, 8), 1000, "cpu")
    actions = torch.randint(0, L, (count,))
    right = (actions // n) * n + (actions % n + 1) % n                 # the torus neighbour right of the action
    cells = torch.arange(L)
    obs = obs_of((cells == actions[:, None]).numpy(), torch.arange(count) / count)
    next_obs = obs_of((cells == right[:, None]).numpy(), torch.rand(count))
    agent.observe(obs, actions, -torch.rand(count), next_obs, torch.zeros(count, dtype=torch.bool),
                  torch.zeros(count, dtype=torch.bool))
    b_obs, b_actions, _, b_next, _ = agent.sample_batch()
    assert torch.equal(b_obs[:, :L].argmax(1), b_actions)
    # a translation keeps "right of the action, same row"; a flat roll would carry it into the next row
    assert torch.equal(b_next[:, :L].argmax(1), (b_actions // n) * n + (b_actions % n + 1) % n)
    assert ((b_actions - actions[(b_obs[:, L] * count).round().long()]) % L != 0).float().mean() > 0.8


# --- the agent ------------------------------------------------------------------------------------

def test_registry_entry_and_defaults_match_dqn():
    method = get_method(AGENT)
    assert (method.display_name, method.family, method.trains) == ("DQN + RAD", "augmentation", True)
    rad, dqn = build_config(AGENT, {}), build_config("dqn", {})
    for name, value in vars(dqn).items():
        assert getattr(rad, name) == value, name
    assert rad.shift is True and rad.flip_prob == 0.05


@pytest.mark.parametrize("bad", [{"flip_prob": -0.1}, {"flip_prob": 0.5}])
def test_config_rejects_bad_flip_prob(bad):
    with pytest.raises(ValueError, match=r"flip_prob must be in \[0, 0.5\)"):
        build_config(AGENT, bad)


def test_greedy_action_is_argmax_q_on_the_raw_observation_and_changes_no_state():
    torch.manual_seed(0)
    agent = make_agent(AGENT, build_config(AGENT, {"hidden_size": 32}), EnvSpec.for_tape(8, 8), 1000, "cpu")
    obs = obs_of(np.random.default_rng(0).integers(0, 2, (64, 8)), torch.rand(64))
    rng = torch.get_rng_state()
    actions = agent.act(obs, greedy=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(actions, agent.q_network(obs).argmax(1))
    assert_per_episode_policy(lambda: (lambda o: agent.act(o, greedy=True)))


def test_learns_fixed_rule_4(tmp_path):
    untrained, trained = learned_success(AGENT, 4, 16, 16, 8_000, tmp_path, {})
    assert untrained < 0.9 and trained >= 0.9, (untrained, trained)


def test_sigkill_resume_is_bit_identical(tmp_path):
    params = {"agent": {"num_envs": 4, "hidden_size": 32, "learning_starts": 200, "target_update_frequency": 200},
              "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical(AGENT, params, tmp_path)
