"""The live-cell policies (rule-agnostic family): flip a live cell, never looking at the rule.

A live cell is a cell whose value differs from the goal's: with the default all-zero goal a cell that is not 0,
in the multi-goal protocol (docs/protocol.md#multi-goal) a cell that mismatches the episode's own goal, so there
`live_leftmost` is the goal-aware one-liner "flip the lowest mismatching cell". `live_leftmost` flips the
lowest-index live cell; `live_random` a uniformly random live cell. On a tape with no live cell (it can occur
only before the first step of an episode whose start is the goal's tape, or with another goal) both flip a
uniformly random cell: the action space is the L cells, there is no no-op action. They read only the
observed tape, so what they reach is what the benchmark gives without knowing the rule; the rule-dependent
headroom (docs/protocol.md#rule-agnostic-floors) is the MPC's success above the best of them.

Their randomness is a pure function of (seed, episode identity, step), as the random policy's
(`episodes.streams.step_keys`), so a seed is an independent, reproducible stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tapebench.episodes.streams import step_keys, uniform_below
from tapebench.methods.contract import EpisodeBatch

LIVE_DOMAIN = 0x4C4956   # separates the live policies' stream from the random policy's stream of the same seed
CHOICES = ("leftmost", "random")


@dataclass
class Config:
    """The live-cell policies have no hyperparameters."""


def live_actions(cells: np.ndarray, words: np.ndarray, choice: str, goals: np.ndarray | None = None) -> np.ndarray:
    """One action per row of `cells` (N, L): the lowest live index (`leftmost`) or the k-th live cell with k
    uniform from `words` (`random`); a row with no live cell gets a cell uniform from `words`. A live cell differs
    from the row's goal (`goals` (N, L); default the all-zero tape)."""
    if choice not in CHOICES:
        raise ValueError(f"live-cell choice must be one of {list(CHOICES)}, got {choice!r}")
    cells = np.asarray(cells)
    if cells.ndim != 2 or len(words) != len(cells):
        raise ValueError(f"cells must be (N, L) with one word per row, got cells {cells.shape} and "
                         f"{len(words)} words")
    live = cells != (0 if goals is None else np.asarray(goals))
    counts = live.sum(axis=1)
    fallback = uniform_below(words, cells.shape[1])
    if choice == "leftmost":
        picked = live.argmax(axis=1)
    else:
        k = ((words >> np.uint64(32)) * counts.astype(np.uint64) >> np.uint64(32)).astype(np.int64)  # in [0, count)
        # index of the (k+1)-th live cell: the first position where the running live count exceeds k
        picked = (np.cumsum(live, axis=1) > k[:, None]).argmax(axis=1)
    return np.where(counts > 0, picked, fallback).astype(np.int64)


class LivePolicy:
    def __init__(self, choice: str, seed: int):
        if choice not in CHOICES:
            raise ValueError(f"live-cell choice must be one of {list(CHOICES)}, got {choice!r}")
        self.choice, self.seed = choice, int(seed)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.t, self.L, self.device = 0, 1, torch.device("cpu")

    def begin(self, batch: EpisodeBatch) -> None:
        self.keys = step_keys(np.asarray(batch.keys, dtype=np.uint64), LIVE_DOMAIN, self.seed)
        self.t, self.L, self.device = 0, batch.L, batch.device
        self.goals = np.asarray(batch.row_goals())   # each row's goal (its own in the multi-goal protocol)

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        cells = obs[:, :self.L].to(torch.uint8).cpu().numpy()
        actions = live_actions(cells, step_keys(self.keys, self.t, self.seed), self.choice, self.goals)
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.t += 1


def make_leftmost(config: Config, context) -> LivePolicy:
    """`live_leftmost`: the lowest-index live cell."""
    return LivePolicy("leftmost", context.seed)


def make_random(config: Config, context) -> LivePolicy:
    """`live_random`: a uniformly random live cell."""
    return LivePolicy("random", context.seed)
