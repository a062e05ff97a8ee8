"""Exact feasibility and the exact optimum on small grids (docs/protocol.md#grid-oracles), by dynamic programming
over all 2^(n²) grids: 512 for n = 3, 65,536 for n = 4. From n = 5 on there are 2^25 ≈ 33.5 million grids and
25 actions each (a table of 839 million transitions per rule), so exact search stops at n = 4 (`MAX_EXACT_GRID`).

As on tapes (`methods.exact`), with T(s, a) = F(flip(s, a)) and the all-zero goal:

  W[0][s] = live cells of s
  W[r][s] = min_a U[r-1](T(s, a)),   U[k](u) = 0 if u is all zero else W[k][u]     (r = 1..H)

W[r][s] is the least number of live cells at the end of an episode with r steps left from s when reaching the
goal ends it (success). So W[r][s] == 0 exactly when success is reachable within r steps, d[s] = min{r ≥ 1 :
W[r][s] == 0} (`UNREACHABLE` if none ≤ H) is the fewest steps to the goal, and where none is reachable W[H][s]
is the least reachable final live-cell count. A grid s is the packed word of `ca.grid_packed` compressed to
n² bits: cell (r, c) is bit r·n + c, so bit a is action a's cell.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench import defaults
from tapebench.ca.grid_packed import ROW_STRIDE, step_words
from tapebench.episodes.accounting import results_dict
from tapebench.grid_rules import GridFamily
from tapebench.methods.grid_mpc import account_steps, check_batch
from tapebench.validation import check_horizon, check_integer, check_success_bonus

MAX_EXACT_GRID = 4   # 2^16 grids; n = 5 would be 2^25 grids x 25 actions per rule
UNREACHABLE = 255


def check_exact_grid(n) -> int:
    n = check_integer(n, "grid side n of the exact search", minimum=3)
    if n > MAX_EXACT_GRID:
        raise ValueError(f"exact search enumerates all 2^(n²) grids and needs n in 3..{MAX_EXACT_GRID}, got n={n} "
                         f"(2^{n * n} grids)")
    return n


def check_exact_grid_horizon(H) -> int:
    H = check_horizon(H)
    if H > 254:
        raise ValueError(f"exact search stores steps-to-goal in a byte and needs H <= 254, got H={H}")
    return H


@nb.njit(cache=True)
def _dense_to_packed(states, n):
    out = np.zeros(states.shape[0], dtype=np.uint64)
    for i in range(states.shape[0]):
        s = states[i]
        w = np.uint64(0)
        for a in range(n * n):
            if (s >> a) & 1:
                w |= np.uint64(1) << np.uint64(ROW_STRIDE * (a // n) + a % n)
        out[i] = w
    return out


@nb.njit(cache=True)
def _packed_to_dense(words, n):
    out = np.zeros(words.shape[0], dtype=np.int64)
    for i in range(words.shape[0]):
        w = words[i]
        s = 0
        for a in range(n * n):
            if (w >> np.uint64(ROW_STRIDE * (a // n) + a % n)) & np.uint64(1):
                s |= 1 << a
        out[i] = s
    return out


def transition_table(rule, family: GridFamily, n: int) -> np.ndarray:
    """T[s, a] = F(flip(s, a)) over all 2^(n²) grids s (dense n²-bit indices) and n² actions, int32."""
    n = check_exact_grid(n)
    rule_id = family.rule(rule).id
    cells = n * n
    states = np.arange(1 << cells, dtype=np.int64)
    flipped = (states[:, None] ^ (1 << np.arange(cells, dtype=np.int64))[None, :]).reshape(-1)
    after = step_words(_dense_to_packed(flipped, n), rule_id, n, family.neighbours == 8)
    return _packed_to_dense(after, n).astype(np.int32).reshape(1 << cells, cells)


def value_layers(rule, family: GridFamily, n: int, H: int) -> tuple[np.ndarray, np.ndarray]:
    """(W (H + 1, 2^(n²)) uint8, d (2^(n²),) uint8): the layers above and the fewest steps to the goal."""
    H = check_exact_grid_horizon(H)
    T = transition_table(rule, family, n)
    live = np.unpackbits(np.arange(1 << (n * n), dtype=np.uint64).view(np.uint8).reshape(-1, 8), axis=1)
    W = np.empty((H + 1, T.shape[0]), dtype=np.uint8)
    W[0] = live.sum(axis=1)
    d = np.full(T.shape[0], UNREACHABLE, dtype=np.uint8)
    for r in range(1, H + 1):
        U = W[r - 1].copy()
        U[0] = 0
        W[r] = U[T].min(axis=1)
        d[(W[r] == 0) & (d == UNREACHABLE)] = r
    return W, d


def dense_index(grids) -> np.ndarray:
    """(N, n, n) grids -> their dense n²-bit indices (cell (r, c) is bit r·n + c)."""
    grids = np.asarray(grids, dtype=np.int64)
    cells = grids.shape[-1] ** 2
    return (grids.reshape(len(grids), cells) << np.arange(cells, dtype=np.int64)).sum(axis=1)


def run_grid_exact(starts, rules, family: GridFamily, H: int, *,
                   success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Play one episode per start grid (N, n, n), n ≤ 4, under its rule with the exact controller: with r steps
    left in grid s it plays the lowest action a minimising U[k](T(s, a)), k = min(d[s], r) − 1, so it reaches
    the goal in the fewest steps whenever it can within H and otherwise ends at the least reachable live-cell
    count. Per-episode arrays as `grid_mpc.run_grid_mpc`."""
    H = check_exact_grid_horizon(H)
    success_bonus = check_success_bonus(success_bonus)
    words, ids, n, _ = check_batch(starts, rules, family, None)
    n = check_exact_grid(n)
    count = len(words)
    metrics = np.zeros((count, 4), dtype=np.float64)
    steps = np.zeros(count, dtype=np.int64)
    log = np.full((count, H), -1, dtype=np.int16)
    states = dense_index(np.asarray(starts, dtype=np.uint8).reshape(count, n, n))
    for rule_id in np.unique(ids):
        rows = np.flatnonzero(ids == rule_id)
        T = transition_table(int(rule_id), family, n)
        W, d = value_layers(int(rule_id), family, n, H)
        U = W.astype(np.int64)
        U[:, 0] = 0
        s = states[rows]
        active = np.ones(len(rows), dtype=np.bool_)
        m_rows, steps_rows, log_rows = metrics[rows], steps[rows], log[rows]
        for t in range(H):
            k = np.minimum(d[s].astype(np.int64), H - t) - 1
            actions = np.argmin(U[k[:, None], T[s]], axis=1)
            s = np.where(active, T[s, actions], s)
            account_steps(m_rows, steps_rows, log_rows, _dense_to_packed(s, n), actions, active, t, n * n,
                          np.float32(success_bonus))
            active &= s != 0
            if not active.any():
                break
        metrics[rows], steps[rows], log[rows] = m_rows, steps_rows, log_rows
    return results_dict(metrics, steps, log, H)
