"""The random policy: a uniformly random cell each step (the floor row of every table).

Some rules are solved by any action (rule 0 maps every tape to the all-zero goal in one step), so the
floor is not zero; it shows what a table's success rates are worth. Its randomness is a pure function
of (seed, episode identity, step), so a seed is an independent, reproducible stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tapebench.episodes.streams import step_keys, uniform_below
from tapebench.methods.contract import EpisodeBatch


@dataclass
class Config:
    """The random policy has no hyperparameters."""


class RandomPolicy:
    def __init__(self, seed: int):
        self.seed = int(seed)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.t, self.L, self.device = 0, 1, torch.device("cpu")

    def begin(self, batch: EpisodeBatch) -> None:
        self.keys, self.t, self.L, self.device = batch.keys, 0, batch.L, batch.device

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        actions = uniform_below(step_keys(self.keys, self.t, self.seed), self.L)
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.t += 1


def make_policy(config: Config, context) -> RandomPolicy:
    return RandomPolicy(context.seed)
