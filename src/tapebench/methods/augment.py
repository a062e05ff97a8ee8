"""Data augmentations of TAPE observations, shared by RAD-DQN and CURL-DQN.

An observation is `[tape (L cells in {0, 1}), t/H]`. Two transforms act on the tape part only:

* **circular shift** by k cells: `tape'[i] = tape[(i - k) mod L]` (what `torch.roll(tape, k)` does).
  The CA is periodic and translation-invariant, and the all-zero goal and the i.i.d. initial tapes are
  shift-invariant, so shifting a transition's observation, next observation *and* action
  (`a -> (a + k) mod L`) gives another transition of the same task with the same reward and
  termination: `F_z(G(roll(s, k), (a + k) mod L)) == roll(F_z(G(s, a)), k)` for every rule z.
  The time feature t/H is not shifted.
* **bit flip**: each tape cell of the observation flips independently with probability p
  (input noise; the next observation and hence the TD target are left alone).

Random draws come from torch's global CPU generator (which the training loop seeds and checkpoints)
and are moved to the data's device, so a seed gives the same augmentations on every device.
"""
from __future__ import annotations

import torch


def random_shifts(n: int, L: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """(n,) shifts k ~ U{0..L-1}, drawn from `generator` (None: torch's global generator)."""
    return torch.randint(0, L, (n,), generator=generator).to(device)


def shift_tapes(obs: torch.Tensor, shifts: torch.Tensor, L: int) -> torch.Tensor:
    """Roll the tape part of each row of `obs` (N, L+1) by its own shift (N,); t/H is kept."""
    cells = torch.arange(L, device=obs.device)
    source = (cells.unsqueeze(0) - shifts.unsqueeze(1)) % L      # tape'[i] = tape[(i - k) mod L]
    out = obs.clone()
    out[:, :L] = torch.gather(obs[:, :L], 1, source)
    return out


def shift_actions(actions: torch.Tensor, shifts: torch.Tensor, L: int) -> torch.Tensor:
    """a -> (a + k) mod L: the cell that the shifted flip hits."""
    return (actions + shifts) % L


def flip_bits(obs: torch.Tensor, prob: float, L: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each tape cell of `obs` (N, L+1) with probability `prob`; t/H is kept. Returns a new tensor.
    The draws come from `generator` (None: torch's global generator)."""
    out = obs.clone()
    if prob > 0.0:
        mask = (torch.rand(obs.shape[0], L, generator=generator) < prob).to(obs.device)
        out[:, :L] = torch.where(mask, 1.0 - obs[:, :L], obs[:, :L])
    return out


def augment_observations(obs: torch.Tensor, L: int, shift: bool, flip_prob: float) -> torch.Tensor:
    """One random view of each observation: a random circular shift (if `shift`), then bit flips."""
    if shift:
        obs = shift_tapes(obs, random_shifts(obs.shape[0], L, obs.device), L)
    return flip_bits(obs, flip_prob, L)


def augment_transitions(obs, actions, rewards, next_obs, terminated, *, L: int, shift: bool, flip_prob: float,
                        generator: torch.Generator | None = None):
    """RAD augmentation of a replay minibatch (obs, actions, rewards, next_obs, terminated).

    With `shift`, each transition gets its own k ~ U{0..L-1} applied to the tape of obs and next_obs and
    to the action. Then each tape cell of obs (only) flips with probability `flip_prob`. Rewards and
    termination are unchanged (the shift preserves them exactly). The draws come from `generator` (None:
    torch's global generator; a seed block passes each seed's own).
    """
    if shift:
        shifts = random_shifts(len(actions), L, obs.device, generator)
        obs, next_obs = shift_tapes(obs, shifts, L), shift_tapes(next_obs, shifts, L)
        actions = shift_actions(actions, shifts, L)
    return flip_bits(obs, flip_prob, L, generator), actions, rewards, next_obs, terminated
