"""Data augmentations of TAPE observations, shared by RAD-DQN and CURL-DQN.

An observation is `[tape (L cells in {0, 1}), t/H]`; on the 2D grid family (`grid` = n, docs/protocol.md#grid) the
L = n * n cells are the n x n torus flattened row-major. Two transforms act on the cells only:

* **circular shift** by k cells: `tape'[i] = tape[(i - k) mod L]` (what `torch.roll(tape, k)` does).
  The CA is periodic and translation-invariant, and the all-zero goal and the i.i.d. initial tapes are
  shift-invariant, so shifting a transition's observation, next observation *and* action
  (`a -> (a + k) mod L`) gives another transition of the same task with the same reward and
  termination: `F_z(G(roll(s, k), (a + k) mod L)) == roll(F_z(G(s, a)), k)` for every rule z.
  The time feature t/H is not shifted. In the multi-goal protocol (observations [s, g, t/H]) the goal's cells
  shift with the tape's: a transition of goal g shifted by k is a transition of goal roll(g, k), same reward.
  On the torus the shift is a 2-D translation: k = dy * n + dx in 0..L-1
  moves cell (r, c) to ((r + dy) mod n, (c + dx) mod n) and the action with it, the same exact symmetry (the grid
  CA commutes with every translation of the torus); it is not a roll of the flattened vector, which would carry
  the end of one row to the start of the next.
* **bit flip**: each tape cell of the observation flips independently with probability p
  (input noise; the next observation and hence the TD target are left alone).

Random draws come from torch's global CPU generator (which the training loop seeds and checkpoints)
and are moved to the data's device, so a seed gives the same augmentations on every device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tapebench.methods.contract import split_observation


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
    t/H is kept. Observations (N, 2L+1) [s, g, t/H] of the multi-goal protocol shift the goal's cells with the
    tape's, by the same shift (the shifted transition is one of the shifted goal's task)."""
    cells = torch.arange(L, device=obs.device)
    source = translate(cells.unsqueeze(0), shifts.unsqueeze(1), L, grid, sign=-1)   # cell'[i] = cell[i - k]
    tape, goal, _ = split_observation(obs, L)
    out = obs.clone()
    out[:, :L] = torch.gather(tape, 1, source)
    if goal is not None:
        out[:, L:2 * L] = torch.gather(goal, 1, source)
    return out


def shift_actions(actions: torch.Tensor, shifts: torch.Tensor, L: int, grid: int | None = None) -> torch.Tensor:
    """a -> a + k (mod L, or the torus translation with `grid`): the cell that the shifted flip hits."""
    return translate(actions, shifts, L, grid)


@dataclass
class View:
    """The random draws of one augmented view of n transitions: each one's shift (None: no shift) and the tape
    cells of its observation to flip (None: no flips)."""

    shifts: torch.Tensor | None
    flips: torch.Tensor | None

    @classmethod
    def draw(cls, n: int, L: int, shift: bool, flip_prob: float, device,
             generator: torch.Generator | None = None) -> "View":
        """The shifts k ~ U{0..L-1} (if `shift`), then the bit flips, drawn from `generator` (None: torch's global
        generator) in that order."""
        shifts = random_shifts(n, L, device, generator) if shift else None
        flips = (torch.rand(n, L, generator=generator) < flip_prob).to(device) if flip_prob > 0.0 else None
        return cls(shifts, flips)

    @classmethod
    def concatenate(cls, views: list["View"]) -> "View":
        """The views of consecutive groups of transitions as one (a seed block's views, seed by seed)."""
        join = lambda parts: None if parts[0] is None else torch.cat(parts)
        return cls(join([v.shifts for v in views]), join([v.flips for v in views]))

    def observations(self, obs: torch.Tensor, L: int, grid: int | None = None) -> torch.Tensor:
        """The view of observations (N, L+1): shifted (a 2-D torus translation with `grid`), then flipped."""
        out = shift_tapes(obs, self.shifts, L, grid) if self.shifts is not None else obs.clone()
        if self.flips is not None:
            out[:, :L] = torch.where(self.flips, 1.0 - out[:, :L], out[:, :L])
        return out

    def transitions(self, obs, actions, rewards, next_obs, terminated, L: int, grid: int | None = None):
        """The view of transitions: each one's shift applied to its observation, next observation and action, then
        the flips to its observation only; rewards and termination unchanged (the shift preserves them exactly)."""
        if self.shifts is not None:
            next_obs = shift_tapes(next_obs, self.shifts, L, grid)
            actions = shift_actions(actions, self.shifts, L, grid)
        return self.observations(obs, L, grid), actions, rewards, next_obs, terminated


def augment_observations(obs: torch.Tensor, L: int, shift: bool, flip_prob: float, grid: int | None = None,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """One random view of each observation: a random circular shift (if `shift`; on the torus with `grid`), then
    bit flips. The draws come from `generator` (None: torch's global generator)."""
    return View.draw(obs.shape[0], L, shift, flip_prob, obs.device, generator).observations(obs, L, grid)


def augment_transitions(obs, actions, rewards, next_obs, terminated, *, L: int, shift: bool, flip_prob: float,
                        generator: torch.Generator | None = None, grid: int | None = None):
    """RAD augmentation of a replay minibatch (obs, actions, rewards, next_obs, terminated).

    With `shift`, each transition gets its own k ~ U{0..L-1} applied to the tape of obs and next_obs and
    to the action (a 2-D torus translation with `grid` = n). Then each tape cell of obs (only) flips with
    probability `flip_prob`. Rewards and termination are unchanged (the shift preserves them exactly). The draws
    come from `generator` (None: torch's global generator).
    """
    view = View.draw(len(actions), L, shift, flip_prob, obs.device, generator)
    return view.transitions(obs, actions, rewards, next_obs, terminated, L, grid)


def seed_views(count: int, n: int, L: int, shift: bool, flip_prob: float, device,
               generators: list[torch.Generator]) -> list[View]:
    """`count` views of each seed's n transitions, seed k's drawn one after another from generators[k] as its
    one-seed run draws them; each view as one `View` of the block's S * n transitions, seed by seed."""
    per_seed = [[View.draw(n, L, shift, flip_prob, device, g) for _ in range(count)] for g in generators]
    return [View.concatenate(list(views)) for views in zip(*per_seed)]


def in_rows(transform, *tensors):
    """`transform` of a seed block's tensors (S, n, ...) applied to their S * n rows, its results back in (S, n,
    ...). A row-wise transform (shifts, flips) gives each seed's rows exactly what its own call would."""
    S, n = tensors[0].shape[:2]
    out = transform(*(t.reshape(S * n, *t.shape[2:]) for t in tensors))
    unflatten = lambda t: t.reshape(S, n, *t.shape[1:])
    return tuple(map(unflatten, out)) if isinstance(out, tuple) else unflatten(out)
