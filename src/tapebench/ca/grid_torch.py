"""Batched torch kernel of the grid physics: (N, n, n) uint8 grids on CPU or CUDA, a rule table per row.

The live-neighbour count is a sum of `torch.roll`s of the batch (the torus wrap), and the next state is a
`torch.gather` of each row's flattened table T[state, count] (`GridFamily.tables(rules).reshape(N, -1)`) at
index state · (m + 1) + count. Any n; tested bit-exact against `grid_reference`.
"""
from __future__ import annotations

import torch

from tapebench.grid_rules import GridFamily


def neighbour_counts(grids: torch.Tensor, family: GridFamily) -> torch.Tensor:
    """(N, n, n) uint8: Σ over the offsets (dr, dc) of x[i + dr, j + dc] with indices mod n."""
    counts = torch.zeros_like(grids)
    for dr, dc in family.offsets:
        counts += torch.roll(grids, shifts=(-dr, -dc), dims=(1, 2))
    return counts


def ca_step(grids: torch.Tensor, tables: torch.Tensor, family: GridFamily) -> torch.Tensor:
    """One update of every row under its own table. grids: (N, n, n) uint8 in {0, 1}; tables: (N, 2(m + 1))
    uint8, row-major T[state, count]."""
    index = grids.to(torch.int64) * family.counts + neighbour_counts(grids, family)
    return torch.gather(tables, 1, index.view(grids.shape[0], -1)).view_as(grids)


def flip(grids: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Flip cell (a // n, a mod n) of each row (a new tensor); actions in 0..n² - 1."""
    out = grids.clone()
    rows = torch.arange(grids.shape[0], device=grids.device)
    out.view(grids.shape[0], -1)[rows, actions] ^= 1
    return out


def transition(grids: torch.Tensor, actions: torch.Tensor, tables: torch.Tensor, family: GridFamily) -> torch.Tensor:
    """s' = F(flip(s, a)) for every row (a new tensor)."""
    return ca_step(flip(grids, actions), tables, family)
