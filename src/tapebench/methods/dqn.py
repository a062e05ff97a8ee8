"""DQN (Mnih et al., 2015) with an optional Double-DQN target (van Hasselt et al., 2016).

Q-network: MLP on the observation [tape, t/H] with one output per cell to flip, or with
`network = "equivariant"` the shift-equivariant network of `equivariant.py` (row `dqn_equivariant`).
Experience from `num_envs` parallel environments goes into a uniform replay buffer; a gradient
step on a Huber TD loss runs every `train_frequency` environment steps once `learning_starts`
steps have been collected; the target network is copied (or Polyak-averaged with `tau < 1`) every
`target_update_frequency` environment steps; exploration is ε-greedy with ε decaying linearly
from `epsilon_start` to `epsilon_end` over the first `exploration_fraction` of the budget.

Truncation (t = H) is not termination: the TD target bootstraps from the episode's last
observation unless the episode ended in strict success. The time feature t/H in the observation
keeps this well defined.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import equivariant
from tapebench.methods.common import adam, due_updates, soft_update_


@dataclass
class Config:
    num_envs: int = 4
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    hidden_size: int = 256
    """width of each hidden layer of the Q-network"""
    hidden_layers: int = 2
    """number of hidden layers (ReLU)"""
    learning_rate: float = 5e-4
    """Adam learning rate"""
    gamma: float = 0.99
    """discount factor"""
    buffer_size: int = 100_000
    """replay buffer capacity, in transitions"""
    batch_size: int = 128
    """transitions per gradient step"""
    learning_starts: int = 1_000
    """environment steps collected before the first gradient step"""
    train_frequency: int = 4
    """environment steps per gradient step (with num_envs = 4: one gradient step per batched step)"""
    target_update_frequency: int = 1_000
    """environment steps between target-network updates"""
    tau: float = 1.0
    """target update rate: 1.0 copies the Q-network, < 1 is a Polyak average"""
    epsilon_start: float = 1.0
    """initial exploration probability"""
    epsilon_end: float = 0.05
    """final exploration probability"""
    exploration_fraction: float = 0.5
    """fraction of the training budget over which ε decays linearly"""
    double_dqn: bool = False
    """Double DQN: the online network picks the next action, the target network values it"""
    max_grad_norm: float = 10.0
    """gradient-norm clipping threshold"""
    network: str = "mlp"
    """Q-network: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular convolutions
    over the cells, Q(s, a) read from cell a's features; docs/methods.md, "Equivariant networks")"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""

    def check(self) -> None:
        equivariant.check_network(self, "DQN")
        positive = ("hidden_size", "hidden_layers", "buffer_size", "batch_size", "train_frequency",
                    "target_update_frequency")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"DQN hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "tau", "epsilon_start", "epsilon_end", "exploration_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DQN hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0 or self.learning_starts < 0:
            raise ValueError("DQN hyperparameters learning_rate and max_grad_norm must be > 0 and "
                             f"learning_starts >= 0, got {self.learning_rate}, {self.max_grad_norm}, "
                             f"{self.learning_starts}")


def mlp(in_dim: int, out_dim: int, hidden_size: int, hidden_layers: int) -> nn.Sequential:
    layers, width = [], in_dim
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, hidden_size), nn.ReLU()]
        width = hidden_size
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def q_network(config: Config, env_spec) -> nn.Module:
    """obs (N, L+1) -> Q-values (N, L): the MLP or the equivariant network, as `config.network` says."""
    if config.network == "equivariant":
        return equivariant.per_cell_network(config, env_spec)
    return mlp(env_spec.obs_dim, env_spec.num_actions, config.hidden_size, config.hidden_layers)


class ReplayBuffer:
    """Uniform replay over the last `capacity` transitions (a ring buffer of tensors)."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, capacity: int, obs_dim: int, device: torch.device):
        self.capacity, self.device = capacity, device
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)
        self.actions = torch.zeros(capacity, dtype=torch.long, device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.terminated = torch.zeros(capacity, device=device)
        self.position = 0   # next slot to write
        self.size = 0

    def add(self, obs, actions, rewards, next_obs, terminated) -> None:
        slots = (self.position + torch.arange(len(actions))) % self.capacity
        slots = slots.to(self.device)
        self.obs[slots] = obs
        self.next_obs[slots] = next_obs
        self.actions[slots] = actions
        self.rewards[slots] = rewards
        self.terminated[slots] = terminated.float()
        self.position = (self.position + len(actions)) % self.capacity
        self.size = min(self.capacity, self.size + len(actions))

    def sample(self, batch_size: int):
        idx = torch.randint(0, self.size, (batch_size,)).to(self.device)
        return self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx], self.terminated[idx]

    def state_dict(self) -> dict:
        n = self.size  # only the filled part (slots >= size are still zero); clone, or torch.save stores it all
        state = {name: getattr(self, name)[:n].cpu().clone() for name in self.FIELDS}
        return {"position": self.position, "size": n, **state}

    def load_state_dict(self, state: dict) -> None:
        n = state["size"]
        if n > self.capacity:
            raise ValueError(f"replay state holds {n} transitions but buffer_size is {self.capacity}")
        for name in self.FIELDS:
            getattr(self, name)[:n] = state[name].to(self.device)
        self.position, self.size = state["position"], n


class DQNAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.num_actions = env_spec.num_actions
        self.total_steps = int(total_steps)
        make_net = lambda: q_network(config, env_spec).to(self.device)
        self.q_network = make_net()
        self.target_network = make_net()
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.optimizer = adam(self.q_network.parameters(), lr=config.learning_rate)
        self.replay = ReplayBuffer(config.buffer_size, env_spec.obs_dim, self.device)
        self.env_steps = 0
        self.gradient_steps = 0
        self.next_train_step = config.train_frequency
        self.next_target_step = config.target_update_frequency

    def epsilon(self) -> float:
        c = self.config
        decay_steps = max(1.0, c.exploration_fraction * self.total_steps)
        frac = min(1.0, self.env_steps / decay_steps)
        return c.epsilon_start + frac * (c.epsilon_end - c.epsilon_start)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        greedy_actions = self.q_network(obs).argmax(dim=1)
        if greedy:
            return greedy_actions
        n = obs.shape[0]
        explore = torch.rand(n) < self.epsilon()
        random_actions = torch.randint(0, self.num_actions, (n,))
        return torch.where(explore.to(self.device), random_actions.to(self.device), greedy_actions)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.replay.add(obs, actions, rewards, next_obs, terminated)
        self.env_steps += len(actions)

    def update(self) -> dict:
        metrics = {}
        gradient_steps, target_updates = due_updates(self, self.config)
        for _ in range(gradient_steps):
            metrics = self._gradient_step()
        for _ in range(target_updates):
            soft_update_(self.target_network, self.q_network, self.config.tau)
        if metrics:
            metrics["epsilon"] = self.epsilon()
        return metrics

    def sample_batch(self):
        """A replay minibatch (obs, actions, rewards, next_obs, terminated); RAD-DQN augments it here."""
        return self.replay.sample(self.config.batch_size)

    def td_loss(self, obs, actions, rewards, next_obs, terminated, q_values=None):
        """Huber TD loss of a minibatch and Q(s, a) of its actions (`q_values`: Q(obs) if already computed)."""
        c = self.config
        with torch.no_grad():
            if c.double_dqn:
                next_actions = self.q_network(next_obs).argmax(dim=1, keepdim=True)
                next_q = self.target_network(next_obs).gather(1, next_actions).squeeze(1)
            else:
                next_q = self.target_network(next_obs).max(dim=1).values
            td_target = rewards + c.gamma * (1.0 - terminated) * next_q
        q_values = self.q_network(obs) if q_values is None else q_values
        q_taken = q_values.gather(1, actions.unsqueeze(1)).squeeze(1)
        return F.smooth_l1_loss(q_taken, td_target), q_taken

    def _gradient_step(self) -> dict:
        c = self.config
        loss, q_taken = self.td_loss(*self.sample_batch())
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q_network.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        return {"td_loss": loss.item(), "q_mean": q_taken.mean().item()}

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"q_network": self.q_network.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.q_network.load_state_dict(state["q_network"])

    def state_dict(self) -> dict:
        return {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                         "next_train_step": self.next_train_step, "next_target_step": self.next_target_step},
        }

    def load_state_dict(self, state: dict) -> None:
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        for name, value in state["counters"].items():
            setattr(self, name, value)


@dataclass
class EquivariantConfig(Config):
    """DQN's Config with the equivariant Q-network (registry row `dqn_equivariant`)."""

    network: str = "equivariant"
    """Q-network: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular convolutions
    over the cells, Q(s, a) read from cell a's features; docs/methods.md, "Equivariant networks")"""


def make(config: Config, env_spec, total_steps: int, device) -> DQNAgent:
    return DQNAgent(config, env_spec, total_steps, device)
