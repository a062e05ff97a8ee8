"""RAD-DQN: DQN whose replay minibatches are augmented (Laskin et al., 2020, "RAD", on DQN).

Everything is DQN (`dqn.py`: network, replay, ε-greedy, Huber TD loss, target network) except that
each sampled minibatch passes through two augmentations (`augment.py`) before the TD loss:

* a random circular shift k ~ U{0..L-1} per transition, applied to the tape of the observation, the
  tape of the next observation and the action index (a -> (a + k) mod L). The CA is periodic and
  the goal (all zeros) and the initial distribution are shift-invariant, so this is an exact symmetry:
  the shifted transition is a real transition of the same rule with the same reward and termination.
  The time feature t/H is not shifted. On the 2D grid family the shift is a translation of the n x n torus
  (`augment.py`), the same exact symmetry.
* bit-flip input noise: each tape cell of the observation flips with probability `flip_prob`; the
  next observation, and hence the TD target, is left alone.

Evaluation is the greedy policy argmax_a Q(o, a) on the raw observation (no augmentation, no state).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tapebench.methods import augment, dqn


@dataclass
class Config(dqn.Config):
    shift: bool = True
    """augment with a random circular shift of obs, next_obs and action (an exact symmetry of the task)"""
    flip_prob: float = 0.05
    """probability that each tape cell of the (current) observation is flipped; 0 switches it off"""

    def check(self) -> None:
        super().check()
        if not 0.0 <= self.flip_prob < 0.5:
            raise ValueError(f"RAD-DQN hyperparameter flip_prob must be in [0, 0.5), got {self.flip_prob}")


class RADDQNAgent(dqn.DQNAgent):
    """DQN with the RAD augmentations applied to every replay minibatch."""

    def __init__(self, config: Config, env_spec, total_steps: int, device):
        super().__init__(config, env_spec, total_steps, device)
        self.L, self.grid = env_spec.L, env_spec.grid

    def sample_batch(self):
        c = self.config
        return augment.augment_transitions(*super().sample_batch(), L=self.L, shift=c.shift, flip_prob=c.flip_prob,
                                           grid=self.grid)


def make(config: Config, env_spec, total_steps: int, device) -> RADDQNAgent:
    return RADDQNAgent(config, env_spec, total_steps, device)


class RADDQNBlock(dqn.DQNBlock):
    """S seeds of RAD-DQN as one seed block (methods/contract.py, "Seed blocks"): DQN's block with each seed's
    minibatch augmented with draws from that seed's own generator, after its replay indices (as alone)."""

    agent_type = RADDQNAgent

    def __init__(self, agents: list[RADDQNAgent], generators: list[torch.Generator]):
        super().__init__(agents, generators)
        self.L, self.grid = agents[0].L, agents[0].grid

    def sample_batch(self):
        c = self.config
        batch = super().sample_batch()
        view, = augment.seed_views(1, c.batch_size, self.L, c.shift, c.flip_prob, self.device, self.generators)
        return augment.in_rows(lambda *rows: view.transitions(*rows, self.L, self.grid), *batch)


def make_block(agents: list[RADDQNAgent], generators: list[torch.Generator]) -> RADDQNBlock:
    """S RAD-DQN agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return RADDQNBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
