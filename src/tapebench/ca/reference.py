"""Plain reference implementation of the tape physics; reads like docs/protocol.md#environment and is
the ground truth."""
from __future__ import annotations

import numpy as np

from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.validation import check_action, check_length


def ca_step(tape, rule: int, family: RuleFamily = ELEMENTARY) -> np.ndarray:
    """One synchronous CA update with periodic boundary.

    Elementary: idx = 4*x[i-1] + 2*x[i] + x[i+1], x'[i] = (rule >> idx) & 1. A family (k, r) reads the
    2r + 1 cells x[i-r..i+r], idx = sum_j x[i+j] * k^(r-j), and x'[i] = digit idx of the rule in base k.
    """
    rule = family.check_rule(rule)
    tape = np.asarray(tape, dtype=np.uint8)
    L = check_length(len(tape))
    out = np.empty(L, dtype=np.uint8)
    if family.elementary:
        for i in range(L):
            left, centre, right = int(tape[(i - 1) % L]), int(tape[i]), int(tape[(i + 1) % L])
            idx = 4 * left + 2 * centre + right
            out[i] = (rule >> idx) & 1
        return out
    for i in range(L):
        idx = 0
        for j in range(-family.r, family.r + 1):
            idx = idx * family.k + int(tape[(i + j) % L])
        out[i] = (rule // family.k ** idx) % family.k
    return out


def flip(tape, action: int, family: RuleFamily = ELEMENTARY) -> np.ndarray:
    """The intervention G: flip one cell (a family with k colours increments it mod k)."""
    tape = np.array(tape, dtype=np.uint8, copy=True)
    action = check_action(action, len(tape))
    tape[action] = (tape[action] + 1) % family.k
    return tape


def transition(tape, action: int, rule: int, family: RuleFamily = ELEMENTARY) -> np.ndarray:
    """s_{t+1} = F_z(G(s_t, a_t)): the CA reads the post-flip tape."""
    return ca_step(flip(tape, action, family), rule, family)


def rollout(tape, rule: int, steps: int, family: RuleFamily = ELEMENTARY) -> np.ndarray:
    """Free CA evolution without actions; returns (steps + 1, L) including the start tape."""
    rows = [np.asarray(tape, dtype=np.uint8)]
    for _ in range(steps):
        rows.append(ca_step(rows[-1], rule, family))
    return np.stack(rows)


def distance(tape, goal) -> float:
    """Normalised Hamming distance in [0, 1]."""
    tape, goal = np.asarray(tape), np.asarray(goal)
    return float(np.mean(tape != goal))
