"""Plain reference implementation of the tape physics; reads like docs/protocol.md#environment and is
the ground truth."""
from __future__ import annotations

import numpy as np

from ..validation import check_action, check_length, check_rule


def ca_step(tape, rule: int) -> np.ndarray:
    """One synchronous elementary-CA update with periodic boundary."""
    rule = check_rule(rule)
    tape = np.asarray(tape, dtype=np.uint8)
    L = check_length(len(tape))
    out = np.empty(L, dtype=np.uint8)
    for i in range(L):
        left, centre, right = int(tape[(i - 1) % L]), int(tape[i]), int(tape[(i + 1) % L])
        idx = 4 * left + 2 * centre + right
        out[i] = (rule >> idx) & 1
    return out


def flip(tape, action: int) -> np.ndarray:
    """The intervention G: flip one cell."""
    tape = np.array(tape, dtype=np.uint8, copy=True)
    action = check_action(action, len(tape))
    tape[action] ^= 1
    return tape


def transition(tape, action: int, rule: int) -> np.ndarray:
    """s_{t+1} = F_z(G(s_t, a_t)): the CA reads the post-flip tape."""
    return ca_step(flip(tape, action), rule)


def rollout(tape, rule: int, steps: int) -> np.ndarray:
    """Free CA evolution without actions; returns (steps + 1, L) including the start tape."""
    rows = [np.asarray(tape, dtype=np.uint8)]
    for _ in range(steps):
        rows.append(ca_step(rows[-1], rule))
    return np.stack(rows)


def distance(tape, goal) -> float:
    """Normalised Hamming distance in [0, 1]."""
    tape, goal = np.asarray(tape), np.asarray(goal)
    return float(np.mean(tape != goal))
