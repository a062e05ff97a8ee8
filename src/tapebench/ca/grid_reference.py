"""Plain NumPy reference of the grid physics (docs/protocol.md#grid); the ground truth the packed numba kernel
(`grid_packed`) and the torch kernel (`grid_torch`) are tested bit-exact against.

A grid is (n, n) uint8 in {0, 1} on a torus; a batch is (N, n, n). Cell (i, j) counts the live cells at
(i + dr mod n, j + dc mod n) over the rule's neighbourhood offsets and becomes T[x[i, j], count], T the
rule's table (`GridRule.table`: row 0 birth, row 1 survival). Action a flips cell (a // n, a mod n).
"""
from __future__ import annotations

import numpy as np

from tapebench.grid_rules import GridRule
from tapebench.validation import check_grid_size, check_integer


def check_grids(grids, what: str = "grid") -> np.ndarray:
    """(n, n) or (N, n, n) cells in {0, 1} as uint8; the error names the shape or the bad values."""
    arr = np.asarray(grids)
    if arr.ndim not in (2, 3) or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"{what} must be an (n, n) array or an (N, n, n) batch of square grids, got shape {arr.shape}")
    check_grid_size(arr.shape[-1])
    if arr.dtype.kind not in "biuf" or not np.all((arr == 0) | (arr == 1)):
        bad = sorted(set(np.unique(arr).tolist()) - {0, 1}) if arr.dtype.kind in "biuf" else [str(arr.dtype)]
        raise ValueError(f"{what} cells must be 0 or 1, got values {bad}")
    return arr.astype(np.uint8)


def neighbour_counts(grids: np.ndarray, rule: GridRule) -> np.ndarray:
    """Live neighbours of every cell: Σ over the offsets (dr, dc) of x[i + dr, j + dc] (indices mod n)."""
    counts = np.zeros(grids.shape, dtype=np.uint8)
    for dr, dc in rule.family.offsets:
        counts += np.roll(grids, shift=(-dr, -dc), axis=(-2, -1))   # rolled[i, j] = x[i + dr, j + dc]
    return counts


def ca_step(grids, rule: GridRule) -> np.ndarray:
    """One synchronous update of a grid or a batch of grids under one rule."""
    return update(check_grids(grids), rule)


def update(grids: np.ndarray, rule: GridRule) -> np.ndarray:
    """`ca_step` of grids already checked (uint8, 0/1): x' = T[x, count]."""
    return rule.table[grids, neighbour_counts(grids, rule)]


def flip(grid, action: int) -> np.ndarray:
    """The intervention: flip cell (action // n, action mod n) of one (n, n) grid (a new array)."""
    grid = np.array(check_grids(grid), copy=True)
    n = grid.shape[-1]
    action = check_integer(action, "action (cell index, row-major)", 0, n * n - 1)
    grid[action // n, action % n] ^= 1
    return grid


def transition(grid, action: int, rule: GridRule) -> np.ndarray:
    """s' = F(flip(s, a)): the update reads the post-flip grid."""
    return ca_step(flip(grid, action), rule)


def rollout(grid, rule: GridRule, steps: int) -> np.ndarray:
    """Free evolution without actions: (steps + 1, n, n) including the start grid."""
    rows = [check_grids(grid)]
    for _ in range(steps):
        rows.append(ca_step(rows[-1], rule))
    return np.stack(rows)


def distance(grid) -> float:
    """Fraction of live cells: the normalised Hamming distance to the all-zero goal."""
    return float(np.mean(np.asarray(grid) != 0))
