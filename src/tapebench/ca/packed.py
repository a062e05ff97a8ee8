"""Bit-packed numba kernels: one uint64 word per tape (bit i = cell i), L <= 64.

Used for planning (MPC, exact DP) and feature work. The update is a branch-free multiplexer
over the neighbourhood bits, so loops over many tapes with one rule vectorise.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench.validation import check_length

U64 = np.uint64
ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


@nb.njit(cache=True, inline="always")
def length_mask(L):
    return ALL_ONES >> U64(64 - L)


@nb.njit(cache=True, inline="always")
def rule_masks(rule):
    """Eight words, all-ones where the rule's truth-table bit k is set, else zero."""
    m = np.empty(8, dtype=np.uint64)
    for k in range(8):
        m[k] = ALL_ONES if (rule >> k) & 1 else U64(0)
    return m


@nb.njit(cache=True, inline="always")
def step_word_masks(w, m0, m1, m2, m3, m4, m5, m6, m7, L, mask):
    """CA update of one packed tape given the rule's eight bit masks."""
    one = U64(1)
    left = ((w << one) | (w >> U64(L - 1))) & mask    # bit i holds x[i-1]
    right = ((w >> one) | (w << U64(L - 1))) & mask   # bit i holds x[i+1]
    nr = ~right
    g00 = (nr & m0) | (right & m1)   # left=0, centre=0: idx 0/1
    g01 = (nr & m2) | (right & m3)   # left=0, centre=1: idx 2/3
    g10 = (nr & m4) | (right & m5)   # left=1, centre=0: idx 4/5
    g11 = (nr & m6) | (right & m7)   # left=1, centre=1: idx 6/7
    nc = ~w
    f0 = (nc & g00) | (w & g01)
    f1 = (nc & g10) | (w & g11)
    return ((~left & f0) | (left & f1)) & mask


@nb.njit(cache=True)
def step_word(w, rule, L):
    m = rule_masks(rule)
    return step_word_masks(w, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], L, length_mask(L))


@nb.njit(cache=True)
def step_words(words, rule, L):
    """One CA step of many tapes under the same rule."""
    m = rule_masks(rule)
    mask = length_mask(L)
    out = np.empty_like(words)
    for i in range(words.shape[0]):
        out[i] = step_word_masks(words[i], m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], L, mask)
    return out


@nb.njit(cache=True, inline="always")
def rule_bit_mask(rule, k):
    """All-ones word if bit k of the rule's truth table is set, else zero (no allocation)."""
    return U64(0) - U64((rule >> k) & 1)


@nb.njit(cache=True, inline="always")
def step_word_rule(w, rule, L, mask):
    return step_word_masks(w, rule_bit_mask(rule, 0), rule_bit_mask(rule, 1), rule_bit_mask(rule, 2),
                           rule_bit_mask(rule, 3), rule_bit_mask(rule, 4), rule_bit_mask(rule, 5),
                           rule_bit_mask(rule, 6), rule_bit_mask(rule, 7), L, mask)


@nb.njit(cache=True)
def step_words_rules(words, rules, L):
    """One CA step with a different rule per tape."""
    mask = length_mask(L)
    out = np.empty_like(words)
    for i in range(words.shape[0]):
        out[i] = step_word_rule(words[i], rules[i], L, mask)
    return out


EVOLVE_BLOCK = 512  # tapes advanced together in a small local buffer, so the inner loop vectorises


@nb.njit(cache=True)
def evolve_words(words, rule, L, steps):
    """Free evolution of many tapes for `steps` CA steps (returns a new array)."""
    m = rule_masks(rule)
    m0, m1, m2, m3, m4, m5, m6, m7 = m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]
    mask = length_mask(L)
    out = words.copy()
    block = np.empty(EVOLVE_BLOCK, dtype=np.uint64)
    for start in range(0, out.shape[0], EVOLVE_BLOCK):
        stop = min(out.shape[0], start + EVOLVE_BLOCK)
        k = stop - start
        block[:k] = out[start:stop]
        for _ in range(steps):
            for i in range(k):
                block[i] = step_word_masks(block[i], m0, m1, m2, m3, m4, m5, m6, m7, L, mask)
        out[start:stop] = block[:k]
    return out


@nb.njit(cache=True, inline="always")
def transition_word(w, action, m, L, mask):
    """s' = F_z(G(s, a)) on a packed tape, with precomputed rule masks `m`."""
    w = w ^ (U64(1) << U64(action))
    return step_word_masks(w, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], L, mask)


@nb.njit(cache=True, inline="always")
def popcount(w):
    w = w - ((w >> U64(1)) & U64(0x5555555555555555))
    w = (w & U64(0x3333333333333333)) + ((w >> U64(2)) & U64(0x3333333333333333))
    w = (w + (w >> U64(4))) & U64(0x0F0F0F0F0F0F0F0F)
    return (w * U64(0x0101010101010101)) >> U64(56)


def pack(tapes) -> np.ndarray:
    """(N, L) or (L,) array of 0/1 cells -> uint64 words (bit i = cell i)."""
    tapes = np.atleast_2d(np.asarray(tapes, dtype=np.uint64))
    check_length(tapes.shape[1])
    weights = np.left_shift(np.uint64(1), np.arange(tapes.shape[1], dtype=np.uint64))
    return (tapes * weights).sum(axis=1, dtype=np.uint64)


def unpack(words, L: int) -> np.ndarray:
    """uint64 words -> (N, L) uint8 cells."""
    words = np.atleast_1d(np.asarray(words, dtype=np.uint64))
    shifts = np.arange(L, dtype=np.uint64)
    return ((words[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
