"""Bit-packed numba kernel of the grid physics: one uint64 word per grid, n ≤ 8 (`MAX_PACKED`).

Cell (r, c) is bit 8r + c (row stride 8 for every n; for n = 8 bit a is action a's cell), bits outside the
n × n block stay 0. The eight (or four) neighbour words come from shifts with the torus wrap, a bit-sliced
adder turns them into the count's binary digits, and a multiplexer tree over those digits picks each cell's
entry of the rule table, so one word op updates 64 cells. Rules are ids (`GridRule.id`); `moore` says the
neighbourhood. Larger grids use the NumPy reference or the torch kernel. Tested bit-exact against
`grid_reference`.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench.validation import check_integer

MAX_PACKED = 8
U64 = np.uint64
ROW_STRIDE = 8


@nb.njit(cache=True, inline="always")
def masks(n):
    """(valid cells, column 0, column n - 1) of the packed layout."""
    row = (U64(1) << U64(n)) - U64(1)
    valid, col0, last = U64(0), U64(0), U64(0)
    for r in range(n):
        shift = U64(ROW_STRIDE * r)
        valid |= row << shift
        col0 |= U64(1) << shift
        last |= U64(1) << (shift + U64(n - 1))
    return valid, col0, last


@nb.njit(cache=True, inline="always")
def _mux(s, a, b):
    """b where s is set, else a."""
    return a ^ (s & (a ^ b))


@nb.njit(cache=True, inline="always")
def _entry(w, rule_id, count, m1):
    """The table entry T[x, count] of every cell: B's bit where the cell is 0, S's bit where it is 1."""
    born = U64(0) - U64((rule_id >> count) & 1)
    stays = U64(0) - U64((rule_id >> (m1 + count)) & 1)
    return (~w & born) | (w & stays)


@nb.njit(cache=True, inline="always")
def step_word_masks(w, rule_id, n, moore, valid, col0, last):
    """One update of one packed grid (rule_id: `GridRule.id`; moore: 8 neighbours, else von Neumann)."""
    one, sn = U64(1), U64(n - 1)
    west = ((w << one) & ~col0 & valid) | ((w >> sn) & col0)     # bit (r, c) holds x[r, c - 1]
    east = ((w >> one) & ~last & valid) | ((w << sn) & last)     # x[r, c + 1]
    rows = U64(ROW_STRIDE) * sn
    north = ((w << U64(ROW_STRIDE)) | (w >> rows)) & valid       # x[r - 1, c]
    south = ((w >> U64(ROW_STRIDE)) | (w << rows)) & valid       # x[r + 1, c]
    if moore:
        nw = ((north << one) & ~col0 & valid) | ((north >> sn) & col0)
        ne = ((north >> one) & ~last & valid) | ((north << sn) & last)
        sw = ((south << one) & ~col0 & valid) | ((south >> sn) & col0)
        se = ((south >> one) & ~last & valid) | ((south << sn) & last)
        # bit-sliced sum of eight one-bit inputs: digits b0..b3 of the count 0..8
        x1 = west ^ east
        s1 = x1 ^ north
        c1 = (west & east) | (north & x1)
        x2 = south ^ nw
        s2 = x2 ^ ne
        c2 = (south & nw) | (ne & x2)
        s3 = sw ^ se
        c3 = sw & se
        x4 = s1 ^ s2
        b0 = x4 ^ s3
        c4 = (s1 & s2) | (s3 & x4)
        x5 = c1 ^ c2
        t1 = x5 ^ c3
        u1 = (c1 & c2) | (c3 & x5)
        b1 = t1 ^ c4
        u2 = t1 & c4
        b2 = u1 ^ u2
        b3 = u1 & u2
        m1 = 9
        p01 = _mux(b0, _entry(w, rule_id, 0, m1), _entry(w, rule_id, 1, m1))
        p23 = _mux(b0, _entry(w, rule_id, 2, m1), _entry(w, rule_id, 3, m1))
        p45 = _mux(b0, _entry(w, rule_id, 4, m1), _entry(w, rule_id, 5, m1))
        p67 = _mux(b0, _entry(w, rule_id, 6, m1), _entry(w, rule_id, 7, m1))
        low = _mux(b2, _mux(b1, p01, p23), _mux(b1, p45, p67))
        return _mux(b3, low, _entry(w, rule_id, 8, m1)) & valid
    # von Neumann: the count 0..4 of four inputs
    x1 = west ^ east
    s1 = x1 ^ north
    c1 = (west & east) | (north & x1)
    b0 = s1 ^ south
    c2 = s1 & south
    b1 = c1 ^ c2
    b2 = c1 & c2
    m1 = 5
    p01 = _mux(b0, _entry(w, rule_id, 0, m1), _entry(w, rule_id, 1, m1))
    p23 = _mux(b0, _entry(w, rule_id, 2, m1), _entry(w, rule_id, 3, m1))
    return _mux(b2, _mux(b1, p01, p23), _entry(w, rule_id, 4, m1)) & valid


@nb.njit(cache=True)
def step_words(words, rule_id, n, moore):
    """One update of many packed grids under one rule."""
    valid, col0, last = masks(n)
    out = np.empty_like(words)
    for i in range(words.shape[0]):
        out[i] = step_word_masks(words[i], rule_id, n, moore, valid, col0, last)
    return out


@nb.njit(cache=True)
def step_words_rules(words, rule_ids, n, moore):
    """One update of many packed grids, a rule id per grid."""
    valid, col0, last = masks(n)
    out = np.empty_like(words)
    for i in range(words.shape[0]):
        out[i] = step_word_masks(words[i], rule_ids[i], n, moore, valid, col0, last)
    return out


@nb.njit(cache=True)
def evolve_words(words, rule_id, n, moore, steps):
    """Free evolution of many packed grids for `steps` updates (a new array)."""
    valid, col0, last = masks(n)
    out = words.copy()
    for i in range(out.shape[0]):
        w = out[i]
        for _ in range(steps):
            w = step_word_masks(w, rule_id, n, moore, valid, col0, last)
        out[i] = w
    return out


@nb.njit(cache=True)
def transition_words(words, actions, rule_ids, n, moore):
    """s' = F(flip(s, a)) per grid: flip cell (a // n, a mod n), then one update under the grid's rule.
    Like every kernel here it does not check its inputs: actions in 0..n² - 1, ids of the neighbourhood."""
    valid, col0, last = masks(n)
    out = np.empty_like(words)
    for i in range(words.shape[0]):
        a = actions[i]
        w = words[i] ^ (U64(1) << U64(ROW_STRIDE * (a // n) + a % n))
        out[i] = step_word_masks(w, rule_ids[i], n, moore, valid, col0, last)
    return out


@nb.njit(cache=True)
def cycle_words(words, rule_ids, n, moore, max_steps):
    """Transient μ, period λ and entry state x_μ of each grid's free evolution (x_{μ+λ} = x_μ, μ and λ
    smallest), a rule id per grid; (-1, 0, 0) where the sequence does not repeat within `max_steps` updates
    (μ + λ > max_steps).

    Brent's algorithm: no history is stored. Its hare finds a cycle by step 4·max(μ + 1, λ) at the latest, so a
    budget of 4·(max_steps + 1) updates finds every cycle with μ + λ ≤ max_steps; longer ones it happens to
    find are dropped, so the answer depends on max_steps only, not on the search."""
    valid, col0, last = masks(n)
    count = words.shape[0]
    transient = np.full(count, -1, dtype=np.int64)
    period = np.zeros(count, dtype=np.int64)
    entry = np.zeros(count, dtype=np.uint64)
    budget = 4 * (max_steps + 1)
    for i in range(count):
        rid, x0 = rule_ids[i], words[i]
        power, lam, steps = 1, 1, 1
        tortoise = x0
        hare = step_word_masks(x0, rid, n, moore, valid, col0, last)
        found = True
        while tortoise != hare:
            if steps >= budget:
                found = False
                break
            if power == lam:
                tortoise = hare
                power *= 2
                lam = 0
            hare = step_word_masks(hare, rid, n, moore, valid, col0, last)
            lam += 1
            steps += 1
        if not found:
            continue
        tortoise, hare = x0, x0
        for _ in range(lam):
            hare = step_word_masks(hare, rid, n, moore, valid, col0, last)
        mu = 0
        while tortoise != hare:
            tortoise = step_word_masks(tortoise, rid, n, moore, valid, col0, last)
            hare = step_word_masks(hare, rid, n, moore, valid, col0, last)
            mu += 1
        if mu + lam <= max_steps:
            transient[i] = mu
            period[i] = lam
            entry[i] = tortoise
    return transient, period, entry


def check_packed_size(n) -> int:
    return check_integer(n, "grid side n of the packed kernel (one 64-bit word per grid)", 3, MAX_PACKED)


def pack(grids) -> np.ndarray:
    """(N, n, n) or (n, n) cells 0/1 -> uint64 words (cell (r, c) at bit 8r + c), n ≤ 8."""
    grids = np.asarray(grids, dtype=np.uint64)
    grids = grids[None] if grids.ndim == 2 else grids
    n = check_packed_size(grids.shape[-1])
    bits = (ROW_STRIDE * np.arange(n)[:, None] + np.arange(n)[None, :]).astype(np.uint64)
    return (grids << bits).reshape(len(grids), -1).sum(axis=1, dtype=np.uint64)


def unpack(words, n: int) -> np.ndarray:
    """uint64 words -> (N, n, n) uint8 cells."""
    n = check_packed_size(n)
    words = np.atleast_1d(np.asarray(words, dtype=np.uint64))
    bits = (ROW_STRIDE * np.arange(n)[:, None] + np.arange(n)[None, :]).astype(np.uint64)
    return ((words[:, None, None] >> bits) & np.uint64(1)).astype(np.uint8)
