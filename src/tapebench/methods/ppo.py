"""PPO (Schulman et al., 2017) with clipped surrogate, GAE and vectorised rollouts.

Actor and critic are separate MLPs (tanh, orthogonal init) on the observation [tape, t/H], or with
`network = "equivariant"` separate shift-equivariant networks (`equivariant.py`, row `ppo_equivariant`):
the logit of cell a read from cell a's features, the value from the mean over cells.
Each update collects `num_steps` steps from each of `num_envs` environments
(`num_envs * num_steps` environment steps), computes GAE(λ) advantages, then runs
`update_epochs` passes of `num_minibatches` minibatches of the clipped PPO loss with an entropy
bonus. The learning rate optionally anneals linearly to 0 over the budget.

Truncation (t = H) is not termination: on a truncated step the reward is augmented with
γ·V(last observation), and the advantage recursion stops there as it does on termination.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from tapebench.methods import equivariant
from tapebench.methods.common import adam, gae


@dataclass
class Config:
    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    num_steps: int = 128
    """rollout length per environment; one update consumes num_envs * num_steps environment steps"""
    hidden_size: int = 256
    """width of each hidden layer (actor and critic)"""
    hidden_layers: int = 2
    """number of hidden layers (tanh)"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the training budget"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """λ of generalised advantage estimation"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages within each minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping ε"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's value estimates"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient-norm clipping threshold"""
    network: str = "mlp"
    """actor and critic: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular
    convolutions over the cells: cell a's logit from cell a's features, the value pooled over cells;
    docs/methods.md, "Equivariant networks")"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell (actor and critic each)"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""

    def check(self) -> None:
        equivariant.check_network(self, "PPO")
        for name in ("num_steps", "hidden_size", "hidden_layers", "num_minibatches", "update_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"PPO hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPO hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(f"PPO: num_envs * num_steps = {self.num_envs * self.num_steps} must be divisible "
                             f"by num_minibatches = {self.num_minibatches}")
        if self.learning_rate <= 0 or self.clip_coef <= 0 or self.max_grad_norm <= 0:
            raise ValueError("PPO hyperparameters learning_rate, clip_coef and max_grad_norm must be > 0, got "
                             f"{self.learning_rate}, {self.clip_coef}, {self.max_grad_norm}")


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden_size: int, hidden_layers: int, out_std: float) -> nn.Sequential:
    layers, width = [], in_dim
    for _ in range(hidden_layers):
        layers += [layer_init(nn.Linear(width, hidden_size)), nn.Tanh()]
        width = hidden_size
    layers.append(layer_init(nn.Linear(width, out_dim), std=out_std))
    return nn.Sequential(*layers)


def equivariant_network(make, config: Config, env_spec, out_std: float) -> nn.Module:
    """An equivariant actor (`per_cell_network`) or critic (`pooled_network`), tanh, orthogonal init as the MLP's."""
    network = make(config, env_spec, activation=nn.Tanh)
    for module in network.trunk.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            layer_init(module)
    layer_init(network.head, std=out_std)
    return network


class ActorCritic(nn.Module):
    def __init__(self, config: Config, env_spec):
        super().__init__()
        if config.network == "equivariant":
            self.actor = equivariant_network(equivariant.per_cell_network, config, env_spec, out_std=0.01)
            self.critic = equivariant_network(equivariant.pooled_network, config, env_spec, out_std=1.0)
            return
        obs_dim, num_actions, hidden_size, hidden_layers = (env_spec.obs_dim, env_spec.num_actions,
                                                            config.hidden_size, config.hidden_layers)
        self.actor = mlp(obs_dim, num_actions, hidden_size, hidden_layers, out_std=0.01)
        self.critic = mlp(obs_dim, 1, hidden_size, hidden_layers, out_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def action_and_value(self, obs: torch.Tensor, actions: torch.Tensor | None = None):
        dist = Categorical(logits=self.actor(obs))
        if actions is None:
            actions = dist.sample()
        return actions, dist.log_prob(actions), dist.entropy(), self.value(obs)


class Rollout:
    """Storage for one rollout: (num_steps, num_envs) tensors, filled step by step."""

    FIELDS = ("obs", "actions", "logprobs", "rewards", "dones", "values")

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, device: torch.device):
        self.obs = torch.zeros(num_steps, num_envs, obs_dim, device=device)
        self.actions = torch.zeros(num_steps, num_envs, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(num_steps, num_envs, device=device)
        self.rewards = torch.zeros(num_steps, num_envs, device=device)
        self.dones = torch.zeros(num_steps, num_envs, device=device)
        self.values = torch.zeros(num_steps, num_envs, device=device)
        self.last_next_obs = torch.zeros(num_envs, obs_dim, device=device)
        self.position = 0

    def state_dict(self) -> dict:
        state = {name: getattr(self, name).cpu() for name in self.FIELDS + ("last_next_obs",)}
        state["position"] = self.position
        return state

    def load_state_dict(self, state: dict) -> None:
        for name in self.FIELDS + ("last_next_obs",):
            getattr(self, name).copy_(state[name])
        self.position = state["position"]


class PPOAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.network = ActorCritic(config, env_spec).to(self.device)
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate, eps=1e-5)
        self.rollout = Rollout(config.num_steps, config.num_envs, env_spec.obs_dim, self.device)
        self.num_updates = max(1, math.ceil(total_steps / (config.num_envs * config.num_steps)))
        self.updates_done = 0
        self._pending = None  # log-probs and values of the last exploring `act`, consumed by `observe`

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            return self.network.actor(obs).argmax(dim=1)
        actions, logprobs, _, values = self.network.action_and_value(obs)
        self._pending = (logprobs, values)
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("PPO observe() needs the preceding act(obs, greedy=False)")
        logprobs, values = self._pending
        self._pending = None
        rewards = rewards.float().clone()
        if truncated.any():
            rewards[truncated] += self.config.gamma * self.network.value(next_obs[truncated])
        r, t = self.rollout, self.rollout.position
        r.obs[t], r.actions[t], r.logprobs[t], r.values[t] = obs, actions, logprobs, values
        r.rewards[t], r.dones[t] = rewards, (terminated | truncated).float()
        r.last_next_obs = next_obs.clone()
        r.position += 1

    def update(self) -> dict:
        if self.rollout.position < self.config.num_steps:
            return {}
        c, r = self.config, self.rollout
        if c.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = c.learning_rate * (1.0 - self.updates_done / self.num_updates)
        advantages, returns = self._gae()
        b_obs = r.obs.reshape(-1, r.obs.shape[-1])
        b_actions, b_logprobs, b_values = r.actions.reshape(-1), r.logprobs.reshape(-1), r.values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        batch_size = b_obs.shape[0]
        minibatch_size = batch_size // c.num_minibatches
        clip_fractions = []
        for _ in range(c.update_epochs):
            order = torch.randperm(batch_size).to(self.device)
            for start in range(0, batch_size, minibatch_size):
                mb = order[start:start + minibatch_size]
                _, new_logprob, entropy, new_value = self.network.action_and_value(b_obs[mb], b_actions[mb])
                log_ratio = new_logprob - b_logprobs[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_fractions.append(((ratio - 1.0).abs() > c.clip_coef).float().mean().item())
                mb_adv = b_advantages[mb]
                if c.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                policy_loss = torch.max(-mb_adv * ratio,
                                        -mb_adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
                if c.clip_vloss:
                    v_clipped = b_values[mb] + torch.clamp(new_value - b_values[mb], -c.clip_coef, c.clip_coef)
                    value_loss = 0.5 * torch.max((new_value - b_returns[mb]) ** 2,
                                                 (v_clipped - b_returns[mb]) ** 2).mean()
                else:
                    value_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = policy_loss - c.ent_coef * entropy_loss + c.vf_coef * value_loss
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.network.parameters(), c.max_grad_norm)
                self.optimizer.step()
        self.updates_done += 1
        r.position = 0
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy_loss.item(), "approx_kl": approx_kl.item(),
                "clip_fraction": float(np.mean(clip_fractions))}

    @torch.no_grad()
    def _gae(self):
        r = self.rollout
        return gae(r.rewards, r.values, r.dones, self.network.value(r.last_next_obs), self.config.gamma,
                   self.config.gae_lambda)

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"network": self.network.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])

    def state_dict(self) -> dict:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rollout": self.rollout.state_dict(), "updates_done": self.updates_done}

    def load_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rollout.load_state_dict(state["rollout"])
        self.updates_done = state["updates_done"]


@dataclass
class EquivariantConfig(Config):
    """PPO's Config with the equivariant actor and critic (registry row `ppo_equivariant`)."""

    network: str = "equivariant"
    """actor and critic: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular
    convolutions over the cells: cell a's logit from cell a's features, the value pooled over cells;
    docs/methods.md, "Equivariant networks")"""


def make(config: Config, env_spec, total_steps: int, device) -> PPOAgent:
    return PPOAgent(config, env_spec, total_steps, device)
