"""The linear Q-learning agent (tapebench.methods.contract); imported only when an agent is made, so that listing
the methods (`tapebench methods`, every table and figure job) does not import torch."""
from __future__ import annotations

import torch


class LinearQ:
    def __init__(self, config, env_spec, total_steps: int, device):
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
