"""Linear Q-learning: a minimal third-party tapebench method (the plug-in example of the README and docs/methods.md).

Q(s, a) = W [tape, t/H] + b, one-step Q-learning on every batched transition, ε-greedy exploration. This module
holds what the registry reads (the config, the entry); the agent and torch load only when an agent is made
(`agent.py`), as tapebench's own methods do.
"""
from __future__ import annotations

from dataclasses import dataclass

from tapebench.registry import Method


@dataclass
class Config:
    num_envs: int = 8
    """environments stepped in parallel"""
    learning_rate: float = 0.01
    """SGD step size"""
    gamma: float = 0.9
    """discount factor"""
    epsilon: float = 0.2
    """exploration probability while training"""


def make(config: Config, env_spec, total_steps: int, device):
    from tapebench_linear_q.agent import LinearQ   # torch loads here, not when the registry lists the methods

    return LinearQ(config, env_spec, total_steps, device)


METHOD = Method(id="linear_q", display_name="Linear Q", family="value_based", Config=Config, make_agent=make,
                summary="linear Q-learning (plug-in example)")
