"""Common random numbers for evaluation (docs/protocol.md#decisions).

The initial tape of episode k of rule z on a side is a pure function of
(eval_seed, split key, side, z, k): identical for every agent, seed, checkpoint and the oracle.
The tape does not depend on H, so H = 32 and H = 64 evaluations are paired too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..splits.io import ladder_level
from ..validation import check_goal, check_length, check_rules

SIDE_CODES = {"train": 0, "test": 1, "rules": 2}
LADDER_SIDE_CODE = 100        # ladder level d (side "d<d>", docs/protocol.md#severity-ladders): code 100 + d


def split_key(content_hash: str | None) -> int:
    """Integer key of a split from its content hash (0 for an explicit rule list)."""
    return int(content_hash[:16], 16) if content_hash else 0


def check_side(side: str) -> str:
    if side not in SIDE_CODES and ladder_level(side) is None:
        raise ValueError(f"side must be one of {sorted(SIDE_CODES)} or a ladder level 'd1', 'd2', ..., got {side!r}")
    return side


def side_code(side: str) -> int:
    return SIDE_CODES[side] if side in SIDE_CODES else LADDER_SIDE_CODE + ladder_level(check_side(side))


def _identity(eval_seed: int, key: int, side: str, rule: int, episode: int) -> list[int]:
    return [int(eval_seed), int(key), side_code(side), int(rule), int(episode)]


def episode_key(eval_seed: int, key: int, side: str, rule: int, episode: int) -> np.uint64:
    """A 64-bit identity of one evaluation episode, for methods' per-episode randomness.

    Derived from the same tuple as the initial tape but from a separate stream, so it reveals neither
    the rule nor the tape.
    """
    seq = np.random.SeedSequence(_identity(eval_seed, key, side, rule, episode), spawn_key=(1,))
    return seq.generate_state(1, np.uint64)[0]


def episode_tape(eval_seed: int, key: int, side: str, rule: int, episode: int, L: int, goal) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence(_identity(eval_seed, key, side, rule, episode)))
    while True:
        tape = rng.integers(0, 2, size=L, dtype=np.uint8)
        if not np.array_equal(tape, goal):
            return tape


@dataclass(frozen=True)
class EpisodeSet:
    """Rows are episodes: rule-major, episode index k = 0..E-1 within each rule."""

    rules: np.ndarray      # (N,) int
    episodes: np.ndarray   # (N,) int
    tapes: np.ndarray      # (N, L) uint8 initial tapes
    side: str
    key: int
    keys: np.ndarray       # (N,) uint64 episode identities (`episode_key`)

    def __len__(self) -> int:
        return len(self.rules)

    def subset(self, rows) -> "EpisodeSet":
        """The episodes at `rows` (a slice or index array), identities unchanged."""
        return EpisodeSet(self.rules[rows], self.episodes[rows], self.tapes[rows], self.side, self.key,
                          self.keys[rows])


def episode_set(rules, episodes_per_rule: int, L: int, *, eval_seed: int = 0, key: int = 0,
                side: str = "rules", goal=None) -> EpisodeSet:
    rules = check_rules(rules)
    L = check_length(L)
    side = check_side(side)
    if int(episodes_per_rule) < 1:
        raise ValueError(f"episodes_per_rule must be >= 1, got {episodes_per_rule}")
    goal = check_goal(goal, L)
    rule_col = np.repeat(np.asarray(rules, dtype=np.int64), episodes_per_rule)
    ep_col = np.tile(np.arange(episodes_per_rule, dtype=np.int64), len(rules))
    tapes = np.stack([episode_tape(eval_seed, key, side, z, k, L, goal) for z, k in zip(rule_col, ep_col)])
    keys = np.array([episode_key(eval_seed, key, side, z, k) for z, k in zip(rule_col, ep_col)], dtype=np.uint64)
    return EpisodeSet(rule_col, ep_col, tapes, side, key, keys)
