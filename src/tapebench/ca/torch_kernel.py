"""Batched torch kernel: (N, L) uint8 tapes on CPU or CUDA, a different rule per row.

The hot path (`step_padded_`) works in place on a periodic padded buffer of shape (N, L + 2) whose
columns 0 and L + 1 hold copies of cells L - 1 and 0, so the neighbours are plain slices (no
`torch.roll` copies). The rule is applied through a "rule plane": the row's rule repeated along the
row, (N, L) uint8, so x' = (rule >> idx) & 1 is an elementwise shift of two same-shape uint8 tensors,
which vectorises (a broadcast (N, 1) >> (N, L) shift is ten times slower on CPU).
`ca_step`, `flip` and `transition` are the allocating convenience forms of the same kernel.
"""
from __future__ import annotations

import torch


def pad_periodic(tapes: torch.Tensor) -> torch.Tensor:
    """(N, L) tapes -> new (N, L + 2) buffer with the interior set and the wrap columns filled."""
    padded = torch.empty(tapes.shape[0], tapes.shape[1] + 2, dtype=torch.uint8, device=tapes.device)
    padded[:, 1:-1] = tapes
    refresh_wrap_(padded)
    return padded


def interior(padded: torch.Tensor) -> torch.Tensor:
    """The (N, L) tape view of a padded buffer (shares memory)."""
    return padded[:, 1:-1]


def refresh_wrap_(padded: torch.Tensor) -> None:
    """Copy cell L-1 into column 0 and cell 0 into column L+1 (periodic boundary)."""
    padded[:, 0] = padded[:, -2]
    padded[:, -1] = padded[:, 1]


def rule_plane(rules: torch.Tensor, L: int) -> torch.Tensor:
    """(N,) rules -> (N, L) uint8, each row's rule repeated along the row."""
    return rules.to(torch.uint8).unsqueeze(1).expand(-1, L).contiguous()


def flat_row_offsets(num_rows: int, L: int, device=None) -> torch.Tensor:
    """Flat index of cell 0 of each row in a contiguous (N, L + 2) padded buffer."""
    return torch.arange(num_rows, device=device) * (L + 2) + 1


def flip_padded_(padded: torch.Tensor, actions: torch.Tensor, row_offsets: torch.Tensor) -> None:
    """The intervention G in place: flip cell actions[n] of row n (actions must be in 0..L-1)."""
    flat = padded.view(-1)
    positions = row_offsets + actions
    flat[positions] ^= 1


def step_padded_(padded: torch.Tensor, plane: torch.Tensor, scratch: torch.Tensor) -> None:
    """One CA update of every row in place. padded: contiguous (N, L + 2) uint8 (interior = tapes,
    wrap columns need not be current); plane: (N, L) uint8 rule plane; scratch: (N, L) uint8."""
    refresh_wrap_(padded)
    # idx = 4 * x[i-1] + 2 * x[i] + x[i+1]
    torch.add(padded[:, 2:], padded[:, 1:-1], alpha=2, out=scratch)
    scratch.add_(padded[:, :-2], alpha=4)
    tapes = padded[:, 1:-1]
    torch.bitwise_right_shift(plane, scratch, out=tapes)
    tapes.bitwise_and_(1)


def ca_step(tapes: torch.Tensor, rules: torch.Tensor) -> torch.Tensor:
    """One CA update of each row under its own rule. tapes: (N, L) uint8 in {0,1}; rules: (N,)."""
    padded = pad_periodic(tapes)
    step_padded_(padded, rule_plane(rules, tapes.shape[1]), torch.empty_like(tapes, dtype=torch.uint8))
    return padded[:, 1:-1].contiguous()


def flip(tapes: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Flip cell actions[n] of row n (returns a new tensor)."""
    out = tapes.clone()
    rows = torch.arange(tapes.shape[0], device=tapes.device)
    out[rows, actions] ^= 1
    return out


def transition(tapes: torch.Tensor, actions: torch.Tensor, rules: torch.Tensor) -> torch.Tensor:
    """s' = F_z(G(s, a)) for every row (returns a new tensor)."""
    return ca_step(flip(tapes, actions), rules)
