"""Rainbow (Hessel et al., 2018): DQN with six extensions combined.

* Distributional (C51, Bellemare et al., 2017): the network outputs, per action, a categorical
  distribution over `atoms` fixed return values spread evenly on [v_min, v_max]; the target
  distribution r + γ^n z is projected back onto that support and the loss is the cross-entropy.
* Dueling streams (Wang et al., 2016): a value stream and an advantage stream, combined per atom as
  V + A − mean_a A before the softmax over atoms.
* Noisy nets (Fortunato et al., 2018): the layers of both streams are noisy linear layers with
  factorised Gaussian noise; they replace ε-greedy exploration. Noise is drawn from torch's global
  generator: a fresh sample for every exploring `act`, and fresh online and target samples for every
  gradient step. The greedy policy (`act(obs, greedy=True)`, evaluation) uses the mean weights and
  draws nothing.
* n-step returns (n = 3), built per environment from a sliding window of each row's last n steps
  (`NStepWindow`). A window never crosses an episode boundary: when a row's episode ends, every
  pending transition of that row is emitted with the rewards up to the end; on termination (success)
  nothing is bootstrapped, on truncation (t = H) the target bootstraps from the episode's true last
  observation with γ^m, m the number of steps to the end.
* Prioritised replay (Schaul et al., 2016), proportional: P(i) ∝ p_i^α with p_i the transition's last
  KL loss (new transitions get the largest priority seen), sampled from a sum-tree in `batch_size`
  equal strata; importance weights (N·P(i))^−β, divided by their largest value in the minibatch (so
  they only scale updates down), with β annealed linearly from `priority_beta_start` to 1 over the
  training budget.
* Double Q (van Hasselt et al., 2016): the online network (with its noise) picks the next action by
  its expected return, the target network's distribution for that action is the bootstrap.

The network: one shared ReLU layer on the observation [tape, t/H], then each stream has a noisy
hidden layer and a noisy output layer (value: `atoms` outputs; advantage: L × `atoms`).

A seed block (`make_block`, methods/contract.py "Seed blocks") stacks the online and target networks with each
seed's noise; each seed keeps its own n-step windows and sum-tree and draws its noise and strata from its own
generator in its one-seed order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import stacked
from tapebench.methods.common import adam, due_updates
from tapebench.methods.contract import BlockUnsupported


@dataclass
class Config:
    num_envs: int = 4
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    hidden_size: int = 256
    """width of the shared layer and of each stream's hidden layer"""
    atoms: int = 51
    """number of atoms of the categorical return distribution"""
    v_min: float = -10.0
    """lowest atom of the return support [v_min, v_max] (target values outside are clipped onto it)"""
    v_max: float = 1.0
    """highest atom: the largest possible return (success at the first step: reward = the bonus 1)"""
    noisy_std: float = 0.5
    """σ_0 of the factorised noisy layers (initial σ = σ_0 / sqrt(fan-in))"""
    learning_rate: float = 5e-4
    """Adam learning rate"""
    adam_eps: float = 1.5e-4
    """Adam ε"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 3
    """steps of the multi-step return (the window never crosses an episode boundary)"""
    buffer_size: int = 100_000
    """replay capacity, in n-step transitions"""
    batch_size: int = 32
    """transitions per gradient step"""
    learning_starts: int = 1_000
    """environment steps collected before the first gradient step"""
    train_frequency: int = 4
    """environment steps per gradient step (with num_envs = 4: one gradient step per batched step)"""
    target_update_frequency: int = 1_000
    """environment steps between copies of the online network into the target network"""
    priority_alpha: float = 0.5
    """prioritisation exponent α: P(i) ∝ p_i^α (0 = uniform replay)"""
    priority_beta_start: float = 0.4
    """initial importance-sampling exponent β, annealed linearly to 1 over the training budget"""
    priority_epsilon: float = 1e-6
    """added to the KL loss so every transition keeps a non-zero priority"""
    max_grad_norm: float = 10.0
    """gradient-norm clipping threshold"""

    def check(self) -> None:
        positive = ("hidden_size", "n_step", "buffer_size", "batch_size", "train_frequency",
                    "target_update_frequency")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"Rainbow hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        if self.atoms < 2:
            raise ValueError(f"Rainbow hyperparameter atoms must be >= 2, got {self.atoms}")
        if not self.v_min < self.v_max:
            raise ValueError(f"Rainbow hyperparameters v_min < v_max required, got v_min {self.v_min}, "
                             f"v_max {self.v_max}")
        for name in ("gamma", "priority_alpha", "priority_beta_start"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"Rainbow hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("learning_rate", "adam_eps", "noisy_std", "priority_epsilon", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Rainbow hyperparameter {name} must be > 0, got {getattr(self, name)}")
        if self.buffer_size < self.num_envs * self.n_step:
            raise ValueError(f"Rainbow hyperparameter buffer_size must be >= num_envs * n_step = "
                             f"{self.num_envs * self.n_step} (one step can complete that many transitions), "
                             f"got {self.buffer_size}")
        if self.learning_starts < 0:
            raise ValueError(f"Rainbow hyperparameter learning_starts must be >= 0, got {self.learning_starts}")


# --- network -------------------------------------------------------------------------------------
NOISY_LAYERS = ("value_hidden", "value_out", "advantage_hidden", "advantage_out")   # in the order they draw noise


def factorised_noise(size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """f(ε) = sign(ε) sqrt(|ε|), ε ~ N(0, 1)^size drawn on the CPU from `generator` (None: torch's global one)."""
    x = torch.randn(size, generator=generator)
    return x.sign() * x.abs().sqrt()


def dueling_log_probs(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Value (..., 1, atoms) and advantage (..., A, atoms) logits -> log-probabilities (..., A, atoms) of each
    action's return distribution: softmax over atoms of V + A - mean_a A."""
    logits = value + advantage - advantage.mean(dim=-2, keepdim=True)
    return F.log_softmax(logits, dim=-1)


def expected_returns(log_probs: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """(..., A, atoms) log-probabilities -> (..., A) expected returns on `support`."""
    return (log_probs.exp() * support).sum(dim=-1)


class NoisyLinear(nn.Module):
    """Linear layer y = (μ_w + σ_w ⊙ ε_w) x + μ_b + σ_b ⊙ ε_b with factorised Gaussian noise:
    ε_w = f(ε_out) f(ε_in)^T, ε_b = f(ε_out), f(x) = sign(x) sqrt(|x|). The current noise sample is a
    pair of buffers (part of the state dict); `resample()` draws a new one from torch's global generator."""

    def __init__(self, in_features: int, out_features: int, std_init: float):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), std_init * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), std_init * bound))
        self.register_buffer("epsilon_in", torch.zeros(in_features))
        self.register_buffer("epsilon_out", torch.zeros(out_features))

    @torch.no_grad()
    def resample(self) -> None:
        device = self.epsilon_in.device
        self.epsilon_in.copy_(factorised_noise(self.epsilon_in.shape[0]).to(device))
        self.epsilon_out.copy_(factorised_noise(self.epsilon_out.shape[0]).to(device))

    def forward(self, x: torch.Tensor, noisy: bool = True) -> torch.Tensor:
        if not noisy:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = torch.addcmul(self.weight_mu, self.weight_sigma, torch.outer(self.epsilon_out, self.epsilon_in))
        bias = torch.addcmul(self.bias_mu, self.bias_sigma, self.epsilon_out)
        return F.linear(x, weight, bias)


class RainbowNetwork(nn.Module):
    """obs -> log-probabilities (B, num_actions, atoms) of the return distribution of each action."""

    def __init__(self, obs_dim: int, num_actions: int, atoms: int, hidden_size: int, noisy_std: float):
        super().__init__()
        self.num_actions, self.atoms = num_actions, atoms
        self.torso = nn.Linear(obs_dim, hidden_size)
        self.value_hidden = NoisyLinear(hidden_size, hidden_size, noisy_std)
        self.value_out = NoisyLinear(hidden_size, atoms, noisy_std)
        self.advantage_hidden = NoisyLinear(hidden_size, hidden_size, noisy_std)
        self.advantage_out = NoisyLinear(hidden_size, num_actions * atoms, noisy_std)

    def noisy_layers(self) -> list[NoisyLinear]:
        return [getattr(self, name) for name in NOISY_LAYERS]

    def resample_noise(self) -> None:
        for layer in self.noisy_layers():
            layer.resample()

    def forward(self, obs: torch.Tensor, noisy: bool = True) -> torch.Tensor:
        h = F.relu(self.torso(obs))
        value = self.value_out(F.relu(self.value_hidden(h, noisy)), noisy).view(-1, 1, self.atoms)
        advantage = self.advantage_out(F.relu(self.advantage_hidden(h, noisy)), noisy)
        return dueling_log_probs(value, advantage.view(-1, self.num_actions, self.atoms))


def project_distribution(probs: torch.Tensor, returns: torch.Tensor, discounts: torch.Tensor,
                         support: torch.Tensor) -> torch.Tensor:
    """C51 projection: the distribution of returns + discounts * Z, Z ~ probs on `support`, projected onto
    `support`. probs (..., K); returns, discounts (...,); support (K,) evenly spaced. Each atom's shifted value
    is clipped to [v_min, v_max] and its mass split between the two neighbouring atoms in proportion to
    closeness (mass and, inside the support, the mean are preserved)."""
    atoms = support.shape[0]
    v_min, v_max = support[0].item(), support[-1].item()
    delta = (v_max - v_min) / (atoms - 1)
    shifted = (returns.unsqueeze(-1) + discounts.unsqueeze(-1) * support).clamp(v_min, v_max)
    position = (shifted - v_min) / delta                       # in [0, atoms - 1]
    lower = position.floor().long().clamp(0, atoms - 1)
    upper = (lower + 1).clamp(max=atoms - 1)
    upper_weight = position - lower.to(position.dtype)         # 0 when the value sits on an atom
    projected = torch.zeros_like(probs)
    projected.scatter_add_(-1, lower, probs * (1.0 - upper_weight))
    projected.scatter_add_(-1, upper, probs * upper_weight)
    return projected


# --- n-step returns ------------------------------------------------------------------------------
class NStepWindow:
    """Per-environment windows of the last n steps, turning 1-step transitions into n-step ones.

    `push` takes one batched step and returns the n-step transitions completed by it:
    (obs, actions, returns, discounts, next_obs) with returns = Σ_{k<m} γ^k r_{t+k} and discounts = γ^m,
    or 0 if the episode terminated within the m steps. A row emits its oldest pending transition once
    it has n (m = n, bootstrapping from the current successor); when its episode ends it emits all
    its pending ones (m = n, ..., 1), bootstrapping from the true last observation on truncation,
    and its window is cleared. All rows step together, so the window is a ring shared by the rows,
    each with its own count of pending steps.
    """

    FIELDS = ("obs", "actions", "rewards", "pending")

    def __init__(self, n: int, num_envs: int, obs_dim: int, gamma: float, device: torch.device):
        self.n, self.gamma = n, gamma
        self.obs = torch.zeros(n, num_envs, obs_dim, device=device)
        self.actions = torch.zeros(n, num_envs, dtype=torch.long, device=device)
        self.rewards = torch.zeros(n, num_envs, device=device)
        self.pending = torch.zeros(num_envs, dtype=torch.long, device=device)   # 0..n-1 between pushes
        self.cursor = 0   # ring slot of the next step

    def push(self, obs, actions, rewards, next_obs, terminated, truncated):
        emitted = self.push_rows(obs, actions, rewards, next_obs, terminated, truncated)
        return None if emitted is None else emitted[1]

    def push_rows(self, obs, actions, rewards, next_obs, terminated, truncated):
        """`push`, also saying which row emitted each transition: (rows, transitions) or None."""
        n, slot = self.n, self.cursor
        self.obs[slot], self.actions[slot], self.rewards[slot] = obs, actions, rewards
        self.cursor = (slot + 1) % n
        self.pending += 1
        done = terminated | truncated
        not_terminated = (~terminated).to(self.rewards.dtype)
        ret = torch.zeros_like(self.rewards[0])
        parts = []
        for m in range(1, n + 1):   # the transition of m - 1 steps ago, m steps to now
            start = (slot - m + 1) % n
            ret = self.rewards[start] + self.gamma * ret
            emit = (self.pending >= m) & (done if m < n else torch.ones_like(done))
            if bool(emit.any()):
                rows = emit.nonzero().squeeze(1)
                parts.append((rows, self.obs[start, rows], self.actions[start, rows], ret[rows],
                              (self.gamma ** m) * not_terminated[rows], next_obs[rows]))
        self.pending = torch.where(done, torch.zeros_like(self.pending), self.pending.clamp(max=n - 1))
        if not parts:
            return None
        rows, *transitions = (torch.cat(column) for column in zip(*parts))
        return rows, tuple(transitions)

    def state_dict(self) -> dict:
        return {**{name: getattr(self, name).cpu().clone() for name in self.FIELDS}, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        for name in self.FIELDS:
            getattr(self, name).copy_(state[name])
        self.cursor = state["cursor"]


# --- prioritised replay --------------------------------------------------------------------------
class SumTree:
    """Binary tree over `capacity` leaves (float64) whose internal nodes hold the sums of their children.

    Node 1 is the root; node k has children 2k and 2k + 1; leaf i is node `leaf_base + i`. Every internal
    node is always exactly fl(left + right) of its current children, so the tree is a function of its
    leaves (`from_leaves` rebuilds it bit for bit)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.leaf_base = 1 << max(0, (capacity - 1).bit_length())
        self.nodes = np.zeros(2 * self.leaf_base, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def leaves(self, count: int | None = None) -> np.ndarray:
        return self.nodes[self.leaf_base:self.leaf_base + (self.capacity if count is None else count)]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves (the last value wins for repeated indices) and recompute their ancestors."""
        indices = np.asarray(indices, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        last = len(indices) - 1 - np.unique(indices[::-1], return_index=True)[1]
        nodes = indices[last] + self.leaf_base
        self.nodes[nodes] = values[last]
        while nodes[0] > 1:
            nodes = np.unique(nodes // 2)
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, level by level."""
        level = self.leaf_base
        while level > 1:
            parents = np.arange(level // 2, level)
            self.nodes[parents] = self.nodes[2 * parents] + self.nodes[2 * parents + 1]
            level //= 2

    def find(self, values: np.ndarray) -> np.ndarray:
        """For each value in [0, total): the leaf i with prefix(i) <= value < prefix(i) + leaf(i)."""
        values = np.array(values, dtype=np.float64)
        nodes = np.ones(len(values), dtype=np.int64)
        while nodes[0] < self.leaf_base:
            left = self.nodes[2 * nodes]
            right = values >= left
            values = np.where(right, values - left, values)
            nodes = 2 * nodes + right
        return nodes - self.leaf_base


class ReplayPriorities:
    """The priorities of a proportional prioritised replay over `capacity` ring slots: a sum-tree of p_i^α, the
    largest priority so far, the ring's write position and fill; stratified sampling and importance weights.
    `PrioritizedReplay` adds the stored transitions (a seed block keeps one of these per seed beside its stacked
    transitions)."""

    def __init__(self, capacity: int, alpha: float):
        self.capacity, self.alpha = capacity, alpha
        self.tree = SumTree(capacity)     # leaves hold p_i^α
        self.max_priority = 1.0           # largest p_i so far: the priority of new transitions
        self.position = 0
        self.size = 0

    def claim(self, count: int) -> np.ndarray:
        """The ring slots of `count` new transitions (overwriting the oldest), given the largest priority so far."""
        slots = (self.position + np.arange(count)) % self.capacity
        self.tree.update(slots, np.full(count, self.max_priority ** self.alpha))
        self.position = (self.position + count) % self.capacity
        self.size = min(self.capacity, self.size + count)
        return slots

    def sample(self, batch_size: int, beta: float, generator: torch.Generator | None = None):
        """(indices, importance weights) of `batch_size` transitions, one from each of `batch_size` equal
        strata of the priority mass; uniforms from `generator` (None: torch's global generator)."""
        total = self.tree.total
        uniform = torch.rand(batch_size, dtype=torch.float64, generator=generator).numpy()
        targets = (np.arange(batch_size) + uniform) * (total / batch_size)
        indices = np.minimum(self.tree.find(targets), self.size - 1)   # guards against rounding at the end
        weights = self.importance_weights(indices, beta)
        return indices, weights

    def importance_weights(self, indices: np.ndarray, beta: float) -> np.ndarray:
        """(N·P(i))^−β for the sampled transitions, divided by the largest of them (the minibatch's
        transition with the smallest P): the weights correct the sampling bias and only scale updates down."""
        probabilities = self.tree.leaves(self.size)[indices] / self.tree.total
        weights = (self.size * probabilities) ** -beta
        return weights / weights.max()

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        priorities = np.asarray(priorities, dtype=np.float64)
        self.tree.update(indices, priorities ** self.alpha)
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def copy_priorities(self, other: "ReplayPriorities") -> None:
        """Take `other`'s priorities, position and fill (same capacity)."""
        self.tree.nodes[:] = other.tree.nodes
        self.max_priority, self.position, self.size = other.max_priority, other.position, other.size

    def priority_state(self) -> dict:
        n = self.size
        return {"position": self.position, "size": n, "max_priority": self.max_priority,
                "priorities": torch.from_numpy(self.tree.leaves(n).copy())}

    def load_priority_state(self, state: dict) -> None:
        n = state["size"]
        self.tree.nodes[:] = 0.0
        self.tree.leaves(n)[:] = state["priorities"].numpy()
        self.tree.rebuild()
        self.position, self.size, self.max_priority = state["position"], n, state["max_priority"]


class PrioritizedReplay(ReplayPriorities):
    """Proportional prioritised replay of n-step transitions over the last `capacity` ones."""

    FIELDS = ("obs", "actions", "returns", "discounts", "next_obs")

    def __init__(self, capacity: int, obs_dim: int, alpha: float, device: torch.device):
        super().__init__(capacity, alpha)
        self.device = device
        self.obs = torch.zeros(capacity, obs_dim, device=device)
        self.actions = torch.zeros(capacity, dtype=torch.long, device=device)
        self.returns = torch.zeros(capacity, device=device)
        self.discounts = torch.zeros(capacity, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, device=device)

    def add(self, obs, actions, returns, discounts, next_obs) -> None:
        slots_t = torch.as_tensor(self.claim(len(actions)), device=self.device)
        for name, value in zip(self.FIELDS, (obs, actions, returns, discounts, next_obs)):
            getattr(self, name)[slots_t] = value

    def batch(self, indices: np.ndarray):
        idx = torch.as_tensor(indices, device=self.device)
        return tuple(getattr(self, name)[idx] for name in self.FIELDS)

    def state_dict(self) -> dict:
        n = self.size
        return {**self.priority_state(), **{name: getattr(self, name)[:n].cpu().clone() for name in self.FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        n = state["size"]
        if n > self.capacity:
            raise ValueError(f"replay state holds {n} transitions but buffer_size is {self.capacity}")
        for name in self.FIELDS:
            getattr(self, name)[:n] = state[name].to(self.device)
        self.load_priority_state(state)


# --- agent ---------------------------------------------------------------------------------------
class RainbowAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.total_steps = int(total_steps)
        make_net = lambda: RainbowNetwork(env_spec.obs_dim, env_spec.num_actions, config.atoms, config.hidden_size,
                                          config.noisy_std).to(self.device)
        self.online = make_net()
        self.target = make_net()
        self.target.load_state_dict(self.online.state_dict())
        self.support = torch.linspace(config.v_min, config.v_max, config.atoms, device=self.device)
        self.optimizer = adam(self.online.parameters(), lr=config.learning_rate, eps=config.adam_eps)
        self.replay = PrioritizedReplay(config.buffer_size, env_spec.obs_dim, config.priority_alpha, self.device)
        self.window = NStepWindow(config.n_step, config.num_envs, env_spec.obs_dim, config.gamma, self.device)
        self.env_steps = 0
        self.gradient_steps = 0
        self.next_train_step = config.train_frequency
        self.next_target_step = config.target_update_frequency

    def beta(self) -> float:
        c = self.config
        frac = min(1.0, self.env_steps / max(1, self.total_steps))
        return c.priority_beta_start + frac * (1.0 - c.priority_beta_start)

    def q_values(self, obs: torch.Tensor, noisy: bool) -> torch.Tensor:
        """Expected return of each action under the online network, (B, num_actions)."""
        return (self.online(obs, noisy).exp() * self.support).sum(dim=-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:   # mean weights: no noise drawn, no state changed
            return self.q_values(obs, noisy=False).argmax(dim=1)
        self.online.resample_noise()
        return self.q_values(obs, noisy=True).argmax(dim=1)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        transitions = self.window.push(obs, actions, rewards.float(), next_obs, terminated, truncated)
        if transitions is not None:
            self.replay.add(*transitions)
        self.env_steps += len(actions)

    def update(self) -> dict:
        metrics = {}
        gradient_steps, target_updates = due_updates(self, self.config)
        for _ in range(gradient_steps if self.replay.size > 0 else 0):
            metrics = self._gradient_step()
        for _ in range(target_updates):
            self.target.load_state_dict(self.online.state_dict())
        return metrics

    @torch.no_grad()
    def target_distribution(self, returns, discounts, next_obs) -> torch.Tensor:
        """Double Q: the online network (current noise) picks each next action by its expected return, the
        target network's (current noise) distribution of that action, shifted and projected, is the target."""
        next_actions = self.q_values(next_obs, noisy=True).argmax(dim=1)
        next_probs = self.target(next_obs).exp()[torch.arange(len(next_obs), device=self.device), next_actions]
        return project_distribution(next_probs, returns, discounts, self.support)

    def _gradient_step(self) -> dict:
        c = self.config
        beta = self.beta()
        indices, weights = self.replay.sample(c.batch_size, beta)
        obs, actions, returns, discounts, next_obs = self.replay.batch(indices)
        self.online.resample_noise()
        self.target.resample_noise()
        target = self.target_distribution(returns, discounts, next_obs)
        log_probs = self.online(obs)[torch.arange(len(indices), device=self.device), actions]
        cross_entropy = -(target * log_probs).sum(dim=1)
        loss = (torch.as_tensor(weights, dtype=torch.float32, device=self.device) * cross_entropy).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.online.parameters(), c.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():   # priority: KL(target || prediction) = cross-entropy - entropy(target)
            kl = cross_entropy - (-torch.special.xlogy(target, target).sum(dim=1))
        self.replay.update_priorities(indices, kl.clamp(min=0.0).cpu().double().numpy() + c.priority_epsilon)
        self.gradient_steps += 1
        return {"loss": loss.item(), "beta": beta}

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"online": self.online.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.online.load_state_dict(state["online"])

    def state_dict(self) -> dict:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "window": self.window.state_dict(),
            "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                         "next_train_step": self.next_train_step, "next_target_step": self.next_target_step},
        }

    def load_state_dict(self, state: dict) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.window.load_state_dict(state["window"])
        for name, value in state["counters"].items():
            setattr(self, name, value)


def make(config: Config, env_spec, total_steps: int, device) -> RainbowAgent:
    return RainbowAgent(config, env_spec, total_steps, device)


# --- seed block ----------------------------------------------------------------------------------
COUNTERS = ("env_steps", "gradient_steps", "next_train_step", "next_target_step")


def per_seed(function, *tensors: torch.Tensor) -> torch.Tensor:
    """`function` on each seed's slices of `tensors` (leading dimension S), the results stacked.

    On a CPU each call is the one-seed computation bit for bit: a reduction, a scatter or a transcendental
    element-wise kernel (exp, log) rounds by its operand's layout (which elements fall to the vector lanes and
    which to the scalar tail), so it runs on each seed's slice, the one-seed tensor's layout. Elsewhere one call
    on the stacked tensors (`function` takes leading dimensions): no bit-identity is promised there.
    """
    if tensors[0].device.type != "cpu":
        return function(*tensors)
    return torch.stack([function(*parts) for parts in zip(*(t.unbind(0) for t in tensors))])


class StackedRainbowNetwork:
    """S seeds' `RainbowNetwork`s as one: each parameter (`parameters`, in `RainbowNetwork.parameters()` order) and
    each noise buffer (`noise`, by state-dict name) with a leading seed dimension.

    The products go through `stacked.stacked_linear`; a noisy layer's weight μ + σ ⊙ (ε_out ⊗ ε_in) is composed for
    every seed at once (an element-wise `addcmul`, rounded as the one-seed layer's); the dueling head and the
    softmax run per seed (`per_seed`).
    """

    def __init__(self, networks: list[RainbowNetwork], requires_grad: bool):
        template = networks[0]
        self.num_actions, self.atoms = template.num_actions, template.atoms
        self.parameters = stacked.stack_parameters(networks, requires_grad)
        self.params = dict(zip((name for name, _ in template.named_parameters()), self.parameters))
        self.noise = {name: torch.stack([network.get_buffer(name) for network in networks]).clone()
                      for name, _ in template.named_buffers()}

    @torch.no_grad()
    def resample_noise(self, generators: list[torch.Generator]) -> None:
        """Seed k's new noise from generators[k], layer by layer as `RainbowNetwork.resample_noise` draws it."""
        for layer in NOISY_LAYERS:
            epsilon_in, epsilon_out = self.noise[f"{layer}.epsilon_in"], self.noise[f"{layer}.epsilon_out"]
            draws = [(factorised_noise(epsilon_in.shape[1], g), factorised_noise(epsilon_out.shape[1], g))
                     for g in generators]
            epsilon_in.copy_(torch.stack([d[0] for d in draws]))
            epsilon_out.copy_(torch.stack([d[1] for d in draws]))

    @torch.no_grad()
    def copy_from(self, other: "StackedRainbowNetwork") -> None:
        """Become `other` (parameters and noise): the target network's update."""
        for mine, theirs in zip(self.parameters, other.parameters):
            mine.copy_(theirs)
        for name, tensor in self.noise.items():
            tensor.copy_(other.noise[name])

    @torch.no_grad()
    def write_seed(self, k: int, network: RainbowNetwork) -> None:
        """Seed k's parameters and noise into the one-seed `network`."""
        stacked.write_parameters(self.parameters, k, network)
        for name, tensor in self.noise.items():
            network.get_buffer(name).copy_(tensor[k])

    @torch.no_grad()
    def read_seed(self, k: int, network: RainbowNetwork) -> None:
        """The one-seed `network`'s parameters and noise into seed k."""
        stacked.read_parameters(self.parameters, k, network)
        for name, tensor in self.noise.items():
            tensor[k].copy_(network.get_buffer(name))

    def _noisy_linear(self, x: torch.Tensor, layer: str, noisy: bool) -> torch.Tensor:
        param = lambda name: self.params[f"{layer}.{name}"]
        if not noisy:
            return stacked.stacked_linear(x, param("weight_mu"), param("bias_mu"))
        epsilon_in, epsilon_out = self.noise[f"{layer}.epsilon_in"], self.noise[f"{layer}.epsilon_out"]
        outer = epsilon_out.unsqueeze(2) * epsilon_in.unsqueeze(1)
        weight = torch.addcmul(param("weight_mu"), param("weight_sigma"), outer)
        bias = torch.addcmul(param("bias_mu"), param("bias_sigma"), epsilon_out)
        return stacked.stacked_linear(x, weight, bias)

    def __call__(self, obs: torch.Tensor, noisy: bool = True) -> torch.Tensor:
        """obs (S, B, obs_dim) -> log-probabilities (S, B, num_actions, atoms)."""
        S, B = obs.shape[:2]
        h = torch.relu(stacked.stacked_linear(obs, self.params["torso.weight"], self.params["torso.bias"]))
        value = self._noisy_linear(torch.relu(self._noisy_linear(h, "value_hidden", noisy)), "value_out", noisy)
        advantage = self._noisy_linear(torch.relu(self._noisy_linear(h, "advantage_hidden", noisy)), "advantage_out",
                                       noisy)
        return per_seed(dueling_log_probs, value.view(S, B, 1, self.atoms),
                        advantage.view(S, B, self.num_actions, self.atoms))


def taken(values: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """values (..., A, atoms), actions (...,) -> each row's distribution of its action, (..., atoms)."""
    index = actions.unsqueeze(-1).unsqueeze(-1).expand(*actions.shape, 1, values.shape[-1])
    return values.gather(-2, index).squeeze(-2)


class RainbowBlock:
    """S seeds of Rainbow trained as one (methods/contract.py, "Seed blocks"): stacked online and target networks
    (μ, σ and each seed's noise), one `stacked.SeedAdam`, each seed's n-step windows (one window over the S x num_envs
    rows: a row's window is its own) and prioritised replay (its sum-tree of its own, its transitions in stacked
    tensors (S, buffer_size, ...)); seed k's draws (replay strata, noise) from `generators[k]` only.

    Seed k sees exactly the numbers its single agent would: the same draws in the same order and shapes, the same
    products, its own importance-weighted cross-entropy mean (the losses are summed over seeds for one backward
    pass), its own gradient-norm clip, element-wise Adam and its own priority updates.
    """

    def __init__(self, agents: list[RainbowAgent], generators: list[torch.Generator]):
        if not agents or len(agents) != len(generators):
            raise ValueError(f"a Rainbow seed block needs one generator per agent, got {len(agents)} agents and "
                             f"{len(generators)} generators")
        first = agents[0]
        if any(type(a) is not RainbowAgent for a in agents):
            raise BlockUnsupported(f"RainbowBlock stacks RainbowAgent only, got "
                                   f"{sorted({type(a).__name__ for a in agents})}")
        if any(a.config != first.config or a.total_steps != first.total_steps or a.device != first.device
               for a in agents):
            raise ValueError("a Rainbow seed block's agents must share config, total_steps and device")
        c = self.config = first.config
        first_update = max(c.learning_starts, c.train_frequency, 1)
        if -(-first_update // c.num_envs) < c.n_step:
            # before n batched steps a seed's replay may still be empty while its neighbour's is not: the seeds
            # would take their first gradient steps at different environment steps
            raise BlockUnsupported(f"a Rainbow seed block needs its first gradient step after n_step = {c.n_step} "
                                   f"batched steps (learning_starts >= {c.n_step * c.num_envs}), got "
                                   f"learning_starts {c.learning_starts}, train_frequency {c.train_frequency}")
        self.device, self.total_steps, self.num_seeds = first.device, first.total_steps, len(agents)
        self.generators = generators
        self.support = first.support
        self.online = StackedRainbowNetwork([a.online for a in agents], requires_grad=True)
        self.target = StackedRainbowNetwork([a.target for a in agents], requires_grad=False)
        self.optimizer = stacked.SeedAdam(self.online.parameters, lr=c.learning_rate,
                                          eps=first.optimizer.param_groups[0]["eps"])
        S, obs_dim = self.num_seeds, first.replay.obs.shape[1]
        self.transitions = {name: torch.zeros(S, *getattr(first.replay, name).shape, dtype=getattr(first.replay,
                                              name).dtype, device=self.device) for name in PrioritizedReplay.FIELDS}
        self.priorities = [ReplayPriorities(c.buffer_size, c.priority_alpha) for _ in agents]
        self.window = NStepWindow(c.n_step, S * c.num_envs, obs_dim, c.gamma, self.device)
        self.window.cursor = first.window.cursor
        for name in COUNTERS:
            setattr(self, name, getattr(first, name))
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    beta = RainbowAgent.beta

    def _greedy_actions(self, log_probs: torch.Tensor) -> torch.Tensor:
        return per_seed(lambda lp: expected_returns(lp, self.support).argmax(dim=-1), log_probs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """obs (S, n, obs_dim) -> actions (S, n); exploring: seed k's new noise from generators[k]."""
        if greedy:   # mean weights: no noise drawn, no state changed
            return self._greedy_actions(self.online(obs, noisy=False))
        self.online.resample_noise(self.generators)
        return self._greedy_actions(self.online(obs, noisy=True))

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        S, n = actions.shape
        emitted = self.window.push_rows(obs.flatten(0, 1), actions.flatten(0, 1), rewards.float().flatten(0, 1),
                                        next_obs.flatten(0, 1), terminated.flatten(0, 1), truncated.flatten(0, 1))
        if emitted is not None:
            self._add(emitted[0] // n, emitted[1])
        self.env_steps += n

    def _add(self, seeds: torch.Tensor, transitions: tuple) -> None:
        """Each seed's new transitions (in its one-seed order) into its replay."""
        order = torch.sort(seeds, stable=True).indices   # by seed, each seed's transitions in their emitted order
        capacity, rows = self.config.buffer_size, []
        for k, count in enumerate(torch.bincount(seeds, minlength=self.num_seeds).tolist()):
            if count:
                rows.append(k * capacity + self.priorities[k].claim(count))
        rows = torch.as_tensor(np.concatenate(rows), device=self.device)
        for name, value in zip(PrioritizedReplay.FIELDS, transitions):
            store = self.transitions[name]
            store.view(-1, *store.shape[2:])[rows] = value[order]

    def update(self) -> list[dict]:
        metrics = [{} for _ in range(self.num_seeds)]
        gradient_steps, target_updates = due_updates(self, self.config)
        for _ in range(gradient_steps):
            metrics = self._gradient_step()
        for _ in range(target_updates):
            self.target.copy_from(self.online)
        return metrics

    def _sample(self, beta: float):
        """Each seed's minibatch from its replay: indices (S, B), importance weights (S, B) and the transitions."""
        samples = [p.sample(self.config.batch_size, beta, g) for p, g in zip(self.priorities, self.generators)]
        indices = np.stack([i for i, _ in samples])
        weights = torch.as_tensor(np.stack([w for _, w in samples]), dtype=torch.float32, device=self.device)
        S, capacity = self.num_seeds, self.config.buffer_size
        rows = torch.as_tensor(indices + capacity * np.arange(S)[:, None], device=self.device).view(-1)
        batch = tuple(t.view(S * capacity, *t.shape[2:]).index_select(0, rows).view(S, -1, *t.shape[2:])
                      for t in self.transitions.values())
        return indices, weights, batch

    @torch.no_grad()
    def target_distribution(self, returns, discounts, next_obs) -> torch.Tensor:
        """`RainbowAgent.target_distribution` of every seed, (S, B, atoms)."""
        next_actions = self._greedy_actions(self.online(next_obs, noisy=True))
        next_probs = per_seed(lambda lp, a: taken(lp.exp(), a), self.target(next_obs), next_actions)
        return per_seed(lambda p, r, d: project_distribution(p, r, d, self.support), next_probs, returns, discounts)

    def _gradient_step(self) -> list[dict]:
        c = self.config
        beta = self.beta()
        indices, weights, (obs, actions, returns, discounts, next_obs) = self._sample(beta)
        self.online.resample_noise(self.generators)
        self.target.resample_noise(self.generators)
        target = self.target_distribution(returns, discounts, next_obs)
        log_probs = taken(self.online(obs), actions)
        cross_entropy = per_seed(lambda t, lp: -(t * lp).sum(dim=-1), target, log_probs)
        losses = per_seed(lambda w, ce: (w * ce).mean(dim=-1), weights, cross_entropy)   # each seed's own mean
        self.optimizer.zero_grad()
        losses.sum().backward()
        stacked.clip_grad_norm_per_seed_(self.online.parameters, c.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():   # priority: KL(target || prediction) = cross-entropy - entropy(target)
            kl = per_seed(lambda ce, t: ce - (-torch.special.xlogy(t, t).sum(dim=-1)), cross_entropy, target)
        priorities = kl.clamp(min=0.0).cpu().double().numpy() + c.priority_epsilon
        for k, replay in enumerate(self.priorities):
            replay.update_priorities(indices[k], priorities[k])
        self.gradient_steps += 1
        return [{"loss": loss, "beta": beta} for loss in losses.tolist()]

    # --- one seed in and out of the block ------------------------------------------------------------
    def _seed_window(self, k: int, name: str) -> torch.Tensor:
        """Seed k's rows of the window's field `name` (a view): its one-seed window's tensor."""
        rows = slice(k * self.config.num_envs, (k + 1) * self.config.num_envs)
        field = getattr(self.window, name)
        return field[rows] if name == "pending" else field[:, rows]

    def export_seed(self, k: int, agent: RainbowAgent) -> None:
        """Write seed k's complete training state into `agent` (what a one-seed run holds at this step)."""
        self.online.write_seed(k, agent.online)
        self.target.write_seed(k, agent.target)
        stacked.export_adam_state(self.optimizer, self.online.parameters, k, agent.optimizer,
                                  list(agent.online.parameters()))
        replay = agent.replay
        replay.copy_priorities(self.priorities[k])
        for name, store in self.transitions.items():
            getattr(replay, name)[:replay.size] = store[k, :replay.size]
        for name in NStepWindow.FIELDS:
            getattr(agent.window, name).copy_(self._seed_window(k, name))
        agent.window.cursor = self.window.cursor
        for name in COUNTERS:
            setattr(agent, name, getattr(self, name))

    def import_seed(self, k: int, agent: RainbowAgent) -> None:
        """Write `agent`'s complete training state into seed k (resume); it must be at the block's step."""
        counters = {name: getattr(agent, name) for name in COUNTERS}
        mine = {name: getattr(self, name) for name in COUNTERS}
        if counters != mine or agent.window.cursor != self.window.cursor:
            raise ValueError(f"seed {k} is at {counters} (n-step window cursor {agent.window.cursor}), the block at "
                             f"{mine} (cursor {self.window.cursor}): a block's seeds must be at the same step")
        self.online.read_seed(k, agent.online)
        self.target.read_seed(k, agent.target)
        stacked.import_adam_state(self.optimizer, self.online.parameters, k, agent.optimizer,
                                  list(agent.online.parameters()))
        replay = agent.replay
        self.priorities[k].copy_priorities(replay)
        for name, store in self.transitions.items():
            store[k, :replay.size] = getattr(replay, name)[:replay.size]
        for name in NStepWindow.FIELDS:
            self._seed_window(k, name).copy_(getattr(agent.window, name))


def make_block(agents: list[RainbowAgent], generators: list[torch.Generator]) -> RainbowBlock:
    """S Rainbow agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return RainbowBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
