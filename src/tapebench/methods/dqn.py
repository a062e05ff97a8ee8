"""DQN (Mnih et al., 2015) with an optional Double-DQN target (van Hasselt et al., 2016).

Q-network: MLP on the observation [tape, t/H] with one output per cell to flip, or with
`network = "equivariant"` the shift-equivariant network of `equivariant.py` (row `dqn_equivariant`).
Experience from `num_envs` parallel environments goes into a uniform replay buffer; a gradient
step on a Huber TD loss runs every `train_frequency` environment steps once `learning_starts`
steps have been collected; the target network is copied (or Polyak-averaged with `tau < 1`) every
`target_update_frequency` environment steps; exploration is ε-greedy with ε decaying linearly
from `epsilon_start` to `epsilon_end` over the first `exploration_fraction` of the budget.

In the multi-goal protocol the Q-network reads [s, g, t/H] (the MLP all 2L + 1 entries, the equivariant network
the goal's cells as a channel); `her_strategy = "future"` adds hindsight relabelling (`hindsight.py`).

Truncation (t = H) is not termination: the TD target bootstraps from the episode's last
observation unless the episode ended in strict success. The time feature t/H in the observation
keeps this well defined.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import equivariant, hindsight, stacked
from tapebench.methods.common import adam, due_updates, soft_update_
from tapebench.methods.contract import BlockUnsupported


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
    over the cells, Q(s, a) read from cell a's features; docs/methods/dqn_equivariant.md#equivariant-networks)"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""
    her_strategy: str = "none"
    """hindsight relabelling (HER, `hindsight.py`), multi-goal protocol only: "none", or "future" (each transition is
    also stored her_k times, the goal replaced by a tape its episode reached later, the reward recomputed by the
    environment's reward function for it); refused with the fixed goal"""
    her_k: int = 4
    """her_strategy "future": relabelled copies stored per transition (they share the replay's buffer_size)"""

    def check(self) -> None:
        equivariant.check_network(self, "DQN")
        hindsight.check_strategy(self.her_strategy, self.her_k, "DQN")
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
        hindsight.check_goal_protocol(config.her_strategy, env_spec, "DQN")
        self.hindsight = hindsight.EpisodeRecorder(config.num_envs, env_spec, config.her_k, self.device) \
            if config.her_strategy == "future" else None

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
        if self.hindsight is not None:
            for relabelled in self.hindsight.add(obs, actions, next_obs, terminated | truncated):
                self.replay.add(*relabelled)
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
        state = {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                         "next_train_step": self.next_train_step, "next_target_step": self.next_target_step},
        }
        if self.hindsight is not None:   # the episodes in progress, relabelled when they end
            state["hindsight"] = self.hindsight.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        if self.hindsight is not None:
            self.hindsight.load_state_dict(state["hindsight"])
        for name, value in state["counters"].items():
            setattr(self, name, value)


@dataclass
class EquivariantConfig(Config):
    """DQN's Config with the equivariant Q-network (registry row `dqn_equivariant`)."""

    network: str = "equivariant"
    """Q-network: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular convolutions
    over the cells, Q(s, a) read from cell a's features; docs/methods/dqn_equivariant.md#equivariant-networks)"""


@dataclass
class HERConfig(Config):
    """DQN's Config with hindsight relabelling on (registry row `dqn_her`; multi-goal protocol only)."""

    her_strategy: str = "future"
    """hindsight relabelling (HER, `hindsight.py`), multi-goal protocol only: "none", or "future" (each transition is
    also stored her_k times, the goal replaced by a tape its episode reached later, the reward recomputed by the
    environment's reward function for it); refused with the fixed goal"""


def make(config: Config, env_spec, total_steps: int, device) -> DQNAgent:
    return DQNAgent(config, env_spec, total_steps, device)


COUNTERS = ("env_steps", "gradient_steps", "next_train_step", "next_target_step")
SHARED = {"config": lambda a: a.config, "total_steps": lambda a: a.total_steps, "device": lambda a: a.device}


def block_step(block_or_agent) -> dict:
    """Where a DQN-style block or agent is: its counters and its replay's position and size."""
    replay = getattr(block_or_agent, "replay", block_or_agent)
    return {**{name: getattr(block_or_agent, name) for name in COUNTERS}, "replay": (replay.position, replay.size)}


def block_update(block, online: list[torch.Tensor], target: list[torch.Tensor]) -> list[dict]:
    """`DQNAgent.update` of a seed block: its due gradient steps (`block._gradient_step()`), its due soft updates of
    the stacked `target` tensors towards `online`, ε in the last step's metrics."""
    metrics = [{} for _ in range(block.num_seeds)]
    gradient_steps, target_updates = due_updates(block, block.config)
    for _ in range(gradient_steps):
        metrics = block._gradient_step()
    tau = block.config.tau
    with torch.no_grad():
        for _ in range(target_updates):
            for t, o in zip(target, online):
                t.copy_(tau * o + (1.0 - tau) * t)
    if gradient_steps:
        epsilon = block.epsilon()
        for m in metrics:
            m["epsilon"] = epsilon
    return metrics


class DQNBlock:
    """S seeds of DQN trained as one (methods/contract.py, "Seed blocks"): stacked Q- and target networks, one Adam
    over the stacked tensors, a stacked replay buffer, seed k's random draws from `generators[k]` only.

    Seed k sees exactly the numbers its single agent would: the same draws in the same order and shapes, the same
    products (`stacked.StackedMLP`), its own Huber loss (the losses are summed over seeds for one backward pass, so
    each seed's gradient is its own), its own gradient-norm clip and element-wise Adam.
    """

    agent_type = DQNAgent   # the single agent a block stacks (a subclass's block names its own)

    def __init__(self, agents: list[DQNAgent], generators: list[torch.Generator]):
        stacked.check_block_agents(agents, generators, self.agent_type, type(self).__name__, SHARED)
        if agents[0].config.her_strategy != "none":
            raise BlockUnsupported("a DQN seed block has no hindsight relabelling (her_strategy): its seeds train "
                                   "one after another")
        first = agents[0]
        self.config, self.device, self.total_steps = first.config, first.device, first.total_steps
        self.num_actions, self.num_seeds = first.num_actions, len(agents)
        self.generators = generators
        self.q_parameters = stacked.stack_parameters([a.q_network for a in agents], requires_grad=True)
        self.target_parameters = stacked.stack_parameters([a.target_network for a in agents], requires_grad=False)
        self.q_network = stacked.stacked_network(self.q_parameters, first.q_network)
        self.target_network = stacked.stacked_network(self.target_parameters, first.target_network)
        self.trained_parameters = self.q_parameters + self.stack_extras(agents)
        self.optimizer = stacked.SeedAdam(self.trained_parameters, lr=self.config.learning_rate,
                                          eps=first.optimizer.param_groups[0]["eps"])
        S, capacity, obs_dim = self.num_seeds, self.config.buffer_size, first.replay.obs.shape[1]
        self.obs = torch.zeros(S, capacity, obs_dim, device=self.device)
        self.next_obs = torch.zeros(S, capacity, obs_dim, device=self.device)
        self.actions = torch.zeros(S, capacity, dtype=torch.long, device=self.device)
        self.rewards = torch.zeros(S, capacity, device=self.device)
        self.terminated = torch.zeros(S, capacity, device=self.device)
        self.position, self.size = first.replay.position, first.replay.size
        for name in COUNTERS:
            setattr(self, name, getattr(first, name))
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    epsilon = DQNAgent.epsilon

    def stack_extras(self, agents: list[DQNAgent]) -> list[torch.Tensor]:
        """A subclass's stacked state beside the Q- and target networks; returns the stacked tensors its agents'
        optimiser trains after the Q-network's parameters (`agent_trained_parameters`' order)."""
        return []

    @staticmethod
    def agent_trained_parameters(agent: DQNAgent) -> list[torch.Tensor]:
        """What a single agent's optimiser trains, in its order (the block's `trained_parameters` seed by seed)."""
        return list(agent.q_network.parameters())

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """obs (S, n, obs_dim) -> actions (S, n): seed k's ε-greedy draws from generators[k]."""
        greedy_actions = self.q_network(obs).argmax(dim=2)
        if greedy:
            return greedy_actions
        n, epsilon = obs.shape[1], self.epsilon()
        explore, random_actions = [], []
        for g in self.generators:
            explore.append(torch.rand(n, generator=g) < epsilon)
            random_actions.append(torch.randint(0, self.num_actions, (n,), generator=g))
        explore = torch.stack(explore).to(self.device)
        return torch.where(explore, torch.stack(random_actions).to(self.device), greedy_actions)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        n = actions.shape[1]
        slots = ((self.position + torch.arange(n)) % self.config.buffer_size).to(self.device)
        self.obs[:, slots] = obs
        self.next_obs[:, slots] = next_obs
        self.actions[:, slots] = actions
        self.rewards[:, slots] = rewards
        self.terminated[:, slots] = terminated.float()
        self.position = (self.position + n) % self.config.buffer_size
        self.size = min(self.config.buffer_size, self.size + n)
        self.env_steps += n

    def update(self) -> list[dict]:
        return block_update(self, self.q_parameters, self.target_parameters)

    def sample_batch(self):
        """Each seed's replay minibatch, (S, batch_size, ...): indices from its own generator, one gather."""
        S, B, capacity = self.num_seeds, self.config.batch_size, self.config.buffer_size
        idx = torch.stack([torch.randint(0, self.size, (B,), generator=g) for g in self.generators])
        rows = (idx + capacity * torch.arange(S).unsqueeze(1)).view(-1).to(self.device)   # into (S * capacity) rows
        take = lambda x: x.view(S * capacity, *x.shape[2:]).index_select(0, rows).view(S, B, *x.shape[2:])
        return (take(self.obs), take(self.actions), take(self.rewards), take(self.next_obs), take(self.terminated))

    def td_losses(self, obs, actions, rewards, next_obs, terminated, q_values=None):
        """Each seed's Huber TD loss of its minibatch, (S,), and Q(s, a) of its actions, (S, B) (`DQNAgent.td_loss`
        seed by seed; `q_values`: Q(obs) if already computed)."""
        c = self.config
        with torch.no_grad():
            if c.double_dqn:
                next_actions = self.q_network(next_obs).argmax(dim=2, keepdim=True)
                next_q = self.target_network(next_obs).gather(2, next_actions).squeeze(2)
            else:
                next_q = self.target_network(next_obs).max(dim=2).values
            td_target = rewards + c.gamma * (1.0 - terminated) * next_q
        q_values = self.q_network(obs) if q_values is None else q_values
        q_taken = q_values.gather(2, actions.unsqueeze(2)).squeeze(2)
        return F.smooth_l1_loss(q_taken, td_target, reduction="none").mean(dim=1), q_taken   # each seed's own mean

    def step_optimizer(self, losses: torch.Tensor) -> None:
        """One gradient step on the (S,) per-seed losses: their sum's backward (seed k's gradient is d loss_k, never
        an average over seeds), each seed's gradient-norm clip, Adam."""
        self.optimizer.zero_grad()
        losses.sum().backward()
        stacked.clip_grad_norm_per_seed_(self.trained_parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1

    def _gradient_step(self) -> list[dict]:
        losses, q_taken = self.td_losses(*self.sample_batch())
        self.step_optimizer(losses)
        td_loss, q_mean = losses.tolist(), q_taken.detach().mean(dim=1).tolist()
        return [{"td_loss": loss, "q_mean": q} for loss, q in zip(td_loss, q_mean)]

    # --- one seed in and out of the block ------------------------------------------------------------
    def export_seed(self, k: int, agent: DQNAgent) -> None:
        """Write seed k's complete training state into `agent` (what a one-seed run holds at this step)."""
        stacked.write_parameters(self.q_parameters, k, agent.q_network)
        stacked.write_parameters(self.target_parameters, k, agent.target_network)
        stacked.export_adam_state(self.optimizer, self.trained_parameters, k, agent.optimizer,
                                  self.agent_trained_parameters(agent))
        replay, n = agent.replay, self.size
        for name in ReplayBuffer.FIELDS:
            getattr(replay, name)[:n] = getattr(self, name)[k, :n]
        replay.position, replay.size = self.position, n
        for name in COUNTERS:
            setattr(agent, name, getattr(self, name))

    def import_seed(self, k: int, agent: DQNAgent) -> None:
        """Write `agent`'s complete training state into seed k (resume); its counters must be the block's."""
        stacked.check_same_step(k, block_step(agent), block_step(self))
        stacked.read_parameters(self.q_parameters, k, agent.q_network)
        stacked.read_parameters(self.target_parameters, k, agent.target_network)
        stacked.import_adam_state(self.optimizer, self.trained_parameters, k, agent.optimizer,
                                  self.agent_trained_parameters(agent))
        n = self.size
        for name in ReplayBuffer.FIELDS:
            getattr(self, name)[k, :n] = getattr(agent.replay, name)[:n]


def make_block(agents: list[DQNAgent], generators: list[torch.Generator]) -> DQNBlock:
    """S DQN agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return DQNBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
