"""Linear Q-learning: a minimal third-party tapebench method (the plug-in example of the README and docs/methods.md).

Q(s, a) = W [tape, t/H] + b, one-step Q-learning on every batched transition, ε-greedy exploration.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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


class LinearQ:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config = config
        self.q = torch.nn.Linear(env_spec.obs_dim, env_spec.num_actions).to(device)
        self.optimizer = torch.optim.SGD(self.q.parameters(), lr=config.learning_rate)
        self.num_actions = env_spec.num_actions
        self.pending = None

    @torch.no_grad()
    def act(self, obs, greedy: bool = False):
        actions = self.q(obs).argmax(dim=1)
        if greedy:
            return actions
        explore = torch.rand(len(obs)) < self.config.epsilon
        return torch.where(explore, torch.randint(0, self.num_actions, (len(obs),)), actions)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        self.pending = (obs, actions, rewards, next_obs, terminated)

    def update(self) -> dict:
        obs, actions, rewards, next_obs, terminated = self.pending
        with torch.no_grad():
            target = rewards + self.config.gamma * (~terminated) * self.q(next_obs).max(dim=1).values
        q_taken = self.q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = torch.nn.functional.mse_loss(q_taken, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"td_loss": loss.item()}

    def state_dict(self) -> dict:
        return {"q": self.q.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])
        self.optimizer.load_state_dict(state["optimizer"])

    def policy_state_dict(self) -> dict:
        return {"q": self.q.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])


def make(config: Config, env_spec, total_steps: int, device) -> LinearQ:
    return LinearQ(config, env_spec, total_steps, device)


METHOD = Method(id="linear_q", display_name="Linear Q", family="value_based", Config=Config, make_agent=make,
                summary="linear Q-learning (plug-in example)")
