"""numba kernels for any rule family (k colours, radius r; docs/protocol.md#rule-families).

Tapes are (N, L) uint8 arrays of cells in 0..k-1 (not bit-packed). Rules are given as TABLES, never as
rule numbers (those exceed 64 bits for k = 4, r = 1 and k = 3, r = 2): `tables` is (n_rules, k^(2r+1))
uint8 with `tables[z, idx]` the new cell for neighbourhood index
`idx = sum_{j=-r..r} x[i+j] * k^(r-j)` (left neighbour most significant), i.e. `RuleFamily.tables(rules)`.
Each tape n uses the table `tables[table_index[n]]`; the one-rule forms take a single (K,) table.

    from tapebench.rule_family import RuleFamily
    from tapebench.ca import table_kernel
    family = RuleFamily(3, 1)
    tables = family.tables([rule_a, rule_b])              # (2, 27) uint8
    nxt = table_kernel.step(tapes, tables, table_index, family.k, family.r)
    nxt = table_kernel.transition(tapes, actions, tables, table_index, family.k, family.r)
    traj = table_kernel.evolve(tapes, tables, table_index, family.k, family.r, steps)

`step`, `step_one_rule`, `transition` and `evolve` check their arguments and call the jitted `*_nb`
functions, which trust them. The action is the intervention of the family: cell a is incremented mod k
(a flip for k = 2). The elementary family keeps its bit-packed kernel (`ca.packed`); this one is
tested bit-exact against `ca.reference` for k in {2, 3, 4}, r in {1, 2} and against `ca.packed` for
k = 2, r = 1.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench.rule_family import MAX_COLOURS, MAX_RADIUS, MIN_COLOURS, MIN_RADIUS
from tapebench.validation import check_integer, check_length


@nb.njit(cache=True, inline="always")
def _step_row(tape, table, k, r, top, ext, out):
    """One CA update of one tape into `out`; `ext` is a scratch row of length L + 2r, `top` = k^(2r)."""
    L = tape.shape[0]
    for i in range(L):
        ext[r + i] = tape[i]
    for j in range(r):
        ext[j] = tape[L - r + j]
        ext[r + L + j] = tape[j]
    idx = 0
    for j in range(2 * r):     # the first 2r cells of cell 0's window
        idx = idx * k + ext[j]
    for i in range(L):         # slide: append x[i+r], drop x[i-r-1]
        idx = idx * k + ext[i + 2 * r]
        out[i] = table[idx]
        idx -= ext[i] * top


@nb.njit(cache=True)
def step_nb(tapes, tables, table_index, k, r):
    n, L = tapes.shape
    out = np.empty_like(tapes)
    ext = np.empty(L + 2 * r, dtype=np.int64)
    top = k ** (2 * r)
    for row in range(n):
        _step_row(tapes[row], tables[table_index[row]], k, r, top, ext, out[row])
    return out


@nb.njit(cache=True)
def step_one_rule_nb(tapes, table, k, r):
    n, L = tapes.shape
    out = np.empty_like(tapes)
    ext = np.empty(L + 2 * r, dtype=np.int64)
    top = k ** (2 * r)
    for row in range(n):
        _step_row(tapes[row], table, k, r, top, ext, out[row])
    return out


@nb.njit(cache=True)
def transition_nb(tapes, actions, tables, table_index, k, r):
    n, L = tapes.shape
    out = np.empty_like(tapes)
    ext = np.empty(L + 2 * r, dtype=np.int64)
    row_buf = np.empty(L, dtype=np.uint8)
    top = k ** (2 * r)
    for row in range(n):
        row_buf[:] = tapes[row]
        a = actions[row]
        row_buf[a] = (row_buf[a] + 1) % k
        _step_row(row_buf, tables[table_index[row]], k, r, top, ext, out[row])
    return out


@nb.njit(cache=True)
def evolve_nb(tapes, tables, table_index, k, r, steps):
    n, L = tapes.shape
    out = np.empty((steps + 1, n, L), dtype=np.uint8)
    out[0] = tapes
    ext = np.empty(L + 2 * r, dtype=np.int64)
    top = k ** (2 * r)
    for t in range(steps):
        for row in range(n):
            _step_row(out[t, row], tables[table_index[row]], k, r, top, ext, out[t + 1, row])
    return out


# --- checked entry points ------------------------------------------------------------------

def check_family_shape(k, r) -> tuple[int, int]:
    return (check_integer(k, "colours k", MIN_COLOURS, MAX_COLOURS),
            check_integer(r, "radius r", MIN_RADIUS, MAX_RADIUS))


def _check_tapes(tapes, k: int) -> np.ndarray:
    tapes = np.ascontiguousarray(tapes)
    if tapes.ndim != 2:
        raise ValueError(f"tapes must be a (N, L) array, got shape {tapes.shape}")
    check_length(tapes.shape[1])
    if tapes.dtype != np.uint8:
        if tapes.dtype.kind not in "biu":
            raise ValueError(f"tapes must hold integer cells in 0..{k - 1}, got dtype {tapes.dtype}")
        tapes = tapes.astype(np.uint8)
    if tapes.size and int(tapes.max()) >= k:
        raise ValueError(f"tape cells must be in 0..{k - 1}, got a cell {int(tapes.max())}")
    return tapes


def _check_tables(tables, k: int, r: int, ndim: int = 2) -> np.ndarray:
    tables = np.ascontiguousarray(tables, dtype=np.uint8)
    K = k ** (2 * r + 1)
    if tables.ndim != ndim or tables.shape[-1] != K:
        want = "(n_rules, k^(2r+1))" if ndim == 2 else "(k^(2r+1),)"
        raise ValueError(f"rule tables of k = {k}, r = {r} must have shape {want} with k^(2r+1) = {K}, "
                         f"got {tables.shape}")
    if tables.size and int(tables.max()) >= k:
        raise ValueError(f"rule table entries must be colours in 0..{k - 1}, got {int(tables.max())}")
    return tables


def _check_index(table_index, n: int, n_tables: int) -> np.ndarray:
    table_index = np.ascontiguousarray(table_index, dtype=np.int64)
    if table_index.shape != (n,):
        raise ValueError(f"table_index must have shape ({n},) (one table per tape), got {table_index.shape}")
    if n and (table_index.min() < 0 or table_index.max() >= n_tables):
        raise ValueError(f"table_index must be in 0..{n_tables - 1}, got range "
                         f"{table_index.min()}..{table_index.max()}")
    return table_index


def step(tapes, tables, table_index, k: int, r: int) -> np.ndarray:
    """One CA update of each tape n under table `tables[table_index[n]]`: (N, L) uint8 -> (N, L) uint8."""
    k, r = check_family_shape(k, r)
    tapes = _check_tapes(tapes, k)
    tables = _check_tables(tables, k, r)
    return step_nb(tapes, tables, _check_index(table_index, len(tapes), len(tables)), k, r)


def step_one_rule(tapes, table, k: int, r: int) -> np.ndarray:
    """One CA update of every tape under the same (K,) table."""
    k, r = check_family_shape(k, r)
    return step_one_rule_nb(_check_tapes(tapes, k), _check_tables(table, k, r, ndim=1), k, r)


def transition(tapes, actions, tables, table_index, k: int, r: int) -> np.ndarray:
    """s' = F(G(s, a)) per tape: increment cell actions[n] mod k, then one CA update."""
    k, r = check_family_shape(k, r)
    tapes = _check_tapes(tapes, k)
    tables = _check_tables(tables, k, r)
    actions = np.ascontiguousarray(actions, dtype=np.int64)
    L = tapes.shape[1]
    if actions.shape != (len(tapes),) or (actions.size and (actions.min() < 0 or actions.max() >= L)):
        raise ValueError(f"actions must be ({len(tapes)},) cell indices in 0..{L - 1}, got shape "
                         f"{actions.shape}" + (f" range {actions.min()}..{actions.max()}" if actions.size else ""))
    return transition_nb(tapes, actions, tables, _check_index(table_index, len(tapes), len(tables)), k, r)


def evolve(tapes, tables, table_index, k: int, r: int, steps: int) -> np.ndarray:
    """Free evolution (no actions): (steps + 1, N, L) uint8, including the start tapes."""
    k, r = check_family_shape(k, r)
    steps = check_integer(steps, "steps", 0)
    tapes = _check_tapes(tapes, k)
    tables = _check_tables(tables, k, r)
    return evolve_nb(tapes, tables, _check_index(table_index, len(tapes), len(tables)), k, r, steps)
