"""Data augmentations of TAPE observations, shared by RAD-DQN and CURL-DQN.

An observation is `[tape (L cells in {0, 1}), t/H]`; on the 2D grid family (`grid` = n, docs/protocol.md#grid) the
L = n * n cells are the n x n torus flattened row-major. Two transforms act on the cells only:

* **circular shift** by k cells: `tape'[i] = tape[(i - k) mod L]` (what `torch.roll(tape, k)` does).
  The CA is periodic and translation-invariant, and the all-zero goal and the i.i.d. initial tapes are
  shift-invariant, so shifting a transition's observation, next observation *and* action
  (`a -> (a + k) mod L`) gives another transition of the same task with the same reward and
  termination: `F_z(G(roll(s, k), (a + k) mod L)) == roll(F_z(G(s, a)), k)` for every rule z.
  The time feature t/H is not shifted. On the torus the shift is a 2-D translation: k = dy * n + dx in 0..L-1
  moves cell (r, c) to ((r + dy) mod n, (c + dx) mod n) and the action with it, the same exact symmetry (the grid
  CA commutes with every translation of the torus); it is not a roll of the flattened vector, which would carry
  the end of one row to the start of the next.
* **bit flip**: each tape cell of the observation flips independently with probability p
  (input noise; the next observation and hence the TD target are left alone).

Random draws come from torch's global CPU generator (which the training loop seeds and checkpoints)
and are moved to the data's device, so a seed gives the same augmentations on every device.
"""
from __future__ import annotations

import torch


def random_shifts(n: int, L: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """(n,) shifts k ~ U{0..L-1}, drawn from `generator` (None: torch's global generator). On the n x n torus
    k = dy * n + dx: every translation once, the same draws as on a tape of L cells."""
    return torch.randint(0, L, (n,), generator=generator).to(device)


def translate(cells: torch.Tensor, shifts: torch.Tensor, L: int, grid: int | None = None,
              sign: int = 1) -> torch.Tensor:
    """Cell indices moved by `sign` x the shifts (broadcast): (i + k) mod L on the tape; on the n x n torus
    (`grid` = n, cells row-major) (r, c) -> ((r + dy) mod n, (c + dx) mod n) with k = dy * n + dx."""
    if grid is None:
        return (cells + sign * shifts) % L
    rows, cols = torch.div(cells, grid, rounding_mode="floor"), cells % grid
    dy, dx = torch.div(shifts, grid, rounding_mode="floor"), shifts % grid
    return ((rows + sign * dy) % grid) * grid + (cols + sign * dx) % grid


def shift_tapes(obs: torch.Tensor, shifts: torch.Tensor, L: int, grid: int | None = None) -> torch.Tensor:
    """Shift the cells of each row of `obs` (N, L+1) by its own shift (N,) (a 2-D torus translation with `grid`);
    t/H is kept."""
    cells = torch.arange(L, device=obs.device)
    source = translate(cells.unsqueeze(0), shifts.unsqueeze(1), L, grid, sign=-1)   # cell'[i] = cell[i - k]
    out = obs.clone()
    out[:, :L] = torch.gather(obs[:, :L], 1, source)
    return out


def shift_actions(actions: torch.Tensor, shifts: torch.Tensor, L: int, grid: int | None = None) -> torch.Tensor:
    """a -> a + k (mod L, or the torus translation with `grid`): the cell that the shifted flip hits."""
    return translate(actions, shifts, L, grid)


def flip_bits(obs: torch.Tensor, prob: float, L: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each tape cell of `obs` (N, L+1) with probability `prob`; t/H is kept. Returns a new tensor.
    The draws come from `generator` (None: torch's global generator)."""
    out = obs.clone()
    if prob > 0.0:
        mask = (torch.rand(obs.shape[0], L, generator=generator) < prob).to(obs.device)
        out[:, :L] = torch.where(mask, 1.0 - obs[:, :L], obs[:, :L])
    return out


def augment_observations(obs: torch.Tensor, L: int, shift: bool, flip_prob: float, grid: int | None = None,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """One random view of each observation: a random circular shift (if `shift`; on the torus with `grid`), then
    bit flips. The draws come from `generator` (None: torch's global generator)."""
    if shift:
        obs = shift_tapes(obs, random_shifts(obs.shape[0], L, obs.device, generator), L, grid)
    return flip_bits(obs, flip_prob, L, generator)


def augment_transitions(obs, actions, rewards, next_obs, terminated, *, L: int, shift: bool, flip_prob: float,
                        generator: torch.Generator | None = None, grid: int | None = None):
    """RAD augmentation of a replay minibatch (obs, actions, rewards, next_obs, terminated).

    With `shift`, each transition gets its own k ~ U{0..L-1} applied to the tape of obs and next_obs and
    to the action (a 2-D torus translation with `grid` = n). Then each tape cell of obs (only) flips with
    probability `flip_prob`. Rewards and termination are unchanged (the shift preserves them exactly). The draws come from `generator` (None:
    torch's global generator; a seed block passes each seed's own).
    """
    if shift:
        shifts = random_shifts(len(actions), L, obs.device, generator)
        obs, next_obs = shift_tapes(obs, shifts, L, grid), shift_tapes(next_obs, shifts, L, grid)
        actions = shift_actions(actions, shifts, L, grid)
    return flip_bits(obs, flip_prob, L, generator), actions, rewards, next_obs, terminated
