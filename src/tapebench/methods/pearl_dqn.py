"""PEARL-style DQN (after Rakelly et al., 2019): Q(s, z) with z inferred from the episode so far.

A Q-network conditioned on a latent task variable z inferred from the current episode's transitions.

The rule is fixed within an episode and resampled at every reset, so the context of a step is the
episode's transitions so far. Each transition (tape, one-hot action, reward, next tape) is mapped by an
MLP to a Gaussian factor N(μ_i, σ_i²) on z ∈ R^latent_dim; q(z | context) is the product of these
factors and the prior N(0, I): precision 1 + Σ_i 1/σ_i², mean Σ_i (μ_i/σ_i²) / precision. It does not
depend on the order of the transitions, and the empty context gives exactly the prior.
Q(s, z) is an MLP on [observation, z], or with `network = "equivariant"` the shift-equivariant network of
`equivariant.py` with z broadcast to every cell like t/H (row `pearl_dqn_equivariant`).

Training is DQN (Huber TD loss, replay, target network, linearly decaying ε) plus the context:

* the replay buffer stores, with every transition, its episode id and its index k in the episode;
  a sampled transition k is paired with its context = the transitions 0..k-1 of the same episode
  (exactly what the agent had seen when it chose the action), and its successor state with the
  context 0..k;
* minibatches draw `batch_size / transitions_per_episode` episodes in proportion to their stored
  length and `transitions_per_episode` transitions of each uniformly (so each stored transition is as
  likely as under uniform replay); the encoder reads each drawn episode once, and prefix sums give
  every drawn transition its context;
* Q(s_k, a_k, z) uses z sampled from q(z | 0..k-1) with the reparameterisation trick, so the TD
  loss trains the encoder; KL(q(z | 0..k-1) ‖ N(0, I)) is added with weight `kl_weight`;
* the target is r + γ·max_a Q_target(s_{k+1}, a, mean of q(z | 0..k)), with the posterior from the
  online encoder, detached (as PEARL feeds the target value network the current encoder's z); no
  bootstrap after strict success, truncation bootstraps;
* acting in training: each row keeps the transitions of its current episode (cleared when that
  row's episode ends), z is sampled from their posterior at every step, then ε-greedy on Q(s, z).

Evaluation (`evaluation_policy()`): greedy on Q(s, mean of q(z | the episode's transitions so far)),
kept as running sums of precisions and precision-weighted means per row, reset at every episode start.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import dqn, equivariant, stacked
from tapebench.methods.common import adam, due_updates, soft_update_
from tapebench.methods.dqn import ReplayBuffer, mlp

MIN_FACTOR_VARIANCE = 1e-4  # σ_i² = softplus(raw) + this: caps one transition's precision at 1e4


@dataclass
class Config:
    num_envs: int = 4
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    hidden_size: int = 256
    """width of each hidden layer of the Q-network"""
    hidden_layers: int = 2
    """number of hidden layers of the Q-network (ReLU)"""
    latent_dim: int = 8
    """dimension of the task variable z"""
    encoder_hidden_size: int = 64
    """width of each hidden layer of the transition encoder"""
    encoder_hidden_layers: int = 2
    """number of hidden layers of the transition encoder (ReLU)"""
    kl_weight: float = 0.1
    """weight of KL(q(z | context) ‖ N(0, I)) in the loss"""
    learning_rate: float = 5e-4
    """Adam learning rate (Q-network and encoder)"""
    gamma: float = 0.99
    """discount factor"""
    buffer_size: int = 100_000
    """replay buffer capacity, in transitions"""
    batch_size: int = 128
    """transitions per gradient step (each with its own context)"""
    transitions_per_episode: int = 4
    """transitions drawn from each sampled episode (batch_size must be a multiple): the encoder reads a
    drawn episode once for all of them; 1 draws every transition from its own episode"""
    learning_starts: int = 1_000
    """environment steps collected before the first gradient step"""
    train_frequency: int = 4
    """environment steps per gradient step (with num_envs = 4: one gradient step per batched step)"""
    target_update_frequency: int = 1_000
    """environment steps between target-network updates"""
    tau: float = 1.0
    """target update rate: 1.0 copies the online network, < 1 is a Polyak average"""
    epsilon_start: float = 1.0
    """initial exploration probability"""
    epsilon_end: float = 0.05
    """final exploration probability"""
    exploration_fraction: float = 0.5
    """fraction of the training budget over which ε decays linearly"""
    max_grad_norm: float = 10.0
    """gradient-norm clipping threshold"""
    network: str = "mlp"
    """Q-network: "mlp" (hidden_size x hidden_layers on [observation, z]) or "equivariant" (circular
    convolutions over the cells with z broadcast to every cell like t/H, Q(s, a, z) read from cell a's
    features; docs/methods/dqn_equivariant.md#equivariant-networks); the transition encoder is an MLP either way"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""

    def check(self) -> None:
        equivariant.check_network(self, "PEARL-DQN")
        positive = ("hidden_size", "hidden_layers", "latent_dim", "encoder_hidden_size", "buffer_size",
                    "batch_size", "transitions_per_episode", "train_frequency", "target_update_frequency")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"PEARL-DQN hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        if self.encoder_hidden_layers < 0:
            raise ValueError(f"PEARL-DQN hyperparameter encoder_hidden_layers must be >= 0, "
                             f"got {self.encoder_hidden_layers}")
        for name in ("gamma", "tau", "epsilon_start", "epsilon_end", "exploration_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PEARL-DQN hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        if self.batch_size % self.transitions_per_episode:
            raise ValueError(f"PEARL-DQN hyperparameter batch_size ({self.batch_size}) must be a multiple of "
                             f"transitions_per_episode ({self.transitions_per_episode})")
        if self.kl_weight < 0:
            raise ValueError(f"PEARL-DQN hyperparameter kl_weight must be >= 0, got {self.kl_weight}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0 or self.learning_starts < 0:
            raise ValueError("PEARL-DQN hyperparameters learning_rate and max_grad_norm must be > 0 and "
                             f"learning_starts >= 0, got {self.learning_rate}, {self.max_grad_norm}, "
                             f"{self.learning_starts}")


def transition_features(obs, actions, rewards, next_obs, L: int) -> torch.Tensor:
    """Encoder input of transitions (any leading shape): [tape, one-hot action, reward, next tape]."""
    return torch.cat([obs[..., :L], F.one_hot(actions, L).to(obs.dtype), rewards.unsqueeze(-1).to(obs.dtype),
                      next_obs[..., :L]], dim=-1)


def product_of_gaussians(mu: torch.Tensor, precision: torch.Tensor, context: torch.Tensor, num_contexts: int):
    """q(z | context) = N(0, I) · Π_i N(μ_i, 1/precision_i) for each context.

    mu, precision: (M, d) factors of M transitions; context: (M,) long, the context (0..num_contexts-1)
    each transition belongs to. Returns (mean, variance), each (num_contexts, d); a context without
    transitions gets exactly the prior (mean 0, variance 1).
    """
    sums = mu.new_zeros(num_contexts, mu.shape[1])
    return posterior_from_sums(sums.index_add(0, context, precision), sums.index_add(0, context, mu * precision))


def posterior_from_sums(precision_sum: torch.Tensor, weighted_mean_sum: torch.Tensor):
    """(mean, variance) of N(0, I) times factors with Σ precision_i and Σ precision_i·μ_i."""
    total_precision = 1.0 + precision_sum
    return weighted_mean_sum / total_precision, 1.0 / total_precision


def factors_of(encoder_output: torch.Tensor, latent_dim: int):
    """(μ_i, precision_i = 1/σ_i²) from the encoder's output (M, 2 * latent_dim) of M transitions."""
    mu, raw = encoder_output[:, :latent_dim], encoder_output[:, latent_dim:].contiguous()  # softplus is slow on views
    return mu, 1.0 / (F.softplus(raw) + MIN_FACTOR_VARIANCE)


def kl_to_prior(mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, diag variance) ‖ N(0, I)) per row."""
    return 0.5 * (variance + mean.square() - 1.0 - variance.log()).sum(dim=-1)


class PearlNetwork(nn.Module):
    """Transition encoder (→ Gaussian factors) and Q-head on [observation, z]."""

    def __init__(self, env_spec, config: Config):
        super().__init__()
        self.L, self.latent_dim = env_spec.L, config.latent_dim
        feature_dim = 3 * env_spec.L + 1
        self.encoder = mlp(feature_dim, 2 * config.latent_dim, config.encoder_hidden_size,
                           config.encoder_hidden_layers)
        self.equivariant = config.network == "equivariant"
        if self.equivariant:
            self.q = equivariant.per_cell_network(config, env_spec, extra=config.latent_dim)
        else:
            self.q = mlp(env_spec.obs_dim + config.latent_dim, env_spec.num_actions, config.hidden_size,
                         config.hidden_layers)

    def factors(self, features: torch.Tensor):
        """(μ_i, precision_i = 1/σ_i²) of each transition's factor."""
        return factors_of(self.encoder(features), self.latent_dim)

    def posterior(self, features: torch.Tensor, context: torch.Tensor, num_contexts: int):
        """q(z | context) for transitions `features` (M, feature_dim), each in context `context[i]`."""
        mu, precision = self.factors(features)
        return product_of_gaussians(mu, precision, context, num_contexts)

    def q_values(self, obs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.equivariant:
            return self.q(obs, z)
        return self.q(torch.cat([obs, z], dim=-1))


class EpisodeReplay(ReplayBuffer):
    """DQN's ring buffer plus, per transition, its episode id and its index in the episode.

    The shared loop adds one transition per row at every batched step, so transition k - j of the
    same row's episode lies exactly j·num_envs slots before transition k.
    """

    FIELDS = ReplayBuffer.FIELDS + ("episode", "index")

    def __init__(self, capacity: int, obs_dim: int, num_envs: int, device: torch.device):
        super().__init__(capacity, obs_dim, device)
        self.num_envs = num_envs
        self.episode = torch.zeros(capacity, dtype=torch.long, device=device)
        self.index = torch.zeros(capacity, dtype=torch.long, device=device)

    def add(self, obs, actions, rewards, next_obs, terminated, episode, index) -> None:
        if len(actions) != self.num_envs:
            raise ValueError(f"EpisodeReplay expects one transition per environment ({self.num_envs}), "
                             f"got {len(actions)}")
        slots = ((self.position + torch.arange(len(actions))) % self.capacity).to(self.device)
        self.episode[slots] = episode
        self.index[slots] = index
        super().add(obs, actions, rewards, next_obs, terminated)

    def sample_episodes(self, num_episodes: int, max_length: int, generator: torch.Generator | None = None):
        return sample_episodes(self, num_episodes, max_length, generator)


def sample_episodes(replay, num_episodes: int, max_length: int, generator: torch.Generator | None = None):
    """Episodes drawn with probability proportional to their number of stored transitions: a uniform draw of a
    stored transition, redrawn while its episode's first transition has been overwritten (only the few oldest
    episodes, once the ring buffer has wrapped). `replay`: an `EpisodeReplay` or a seed block's `ReplaySlice`;
    `generator`: None draws from torch's global generator. Returns (slot of each episode's first transition,
    number of its transitions stored so far), each (num_episodes,)."""
    r = replay
    slots = torch.randint(0, r.size, (num_episodes,), generator=generator).to(r.device)
    while True:
        first = (slots - r.index[slots] * r.num_envs) % r.capacity
        lost = r.episode[first] != r.episode[slots]
        if not bool(lost.any()):
            break
        slots[lost] = torch.randint(0, r.size, (int(lost.sum()),), generator=generator).to(r.device)
    later = (first.unsqueeze(1) + torch.arange(max_length, device=r.device) * r.num_envs) % r.capacity
    written = (r.position - 1 - later) % r.capacity < r.size
    stored = written & (r.episode[later] == r.episode[slots].unsqueeze(1))
    return first, stored.sum(dim=1)


@dataclass
class MinibatchDraw:
    """The random part of a minibatch (`draw_minibatch`): which transitions, and which encoder inputs give their
    contexts."""

    slots: torch.Tensor      # (batch_size,) replay slots of the drawn transitions
    features: torch.Tensor   # (M, feature_dim) transitions 0..(last drawn index) of each drawn episode
    where: torch.Tensor      # (M,) each feature row's place, group * H + index in episode, in a dense (groups, H)
    group: torch.Tensor      # (batch_size,) the drawn episode (0..groups-1) of each drawn transition
    index: torch.Tensor      # (batch_size,) its index in that episode
    groups: int


def draw_minibatch(replay, config: Config, H: int, L: int, generator: torch.Generator | None = None) -> MinibatchDraw:
    """batch_size / transitions_per_episode episodes drawn in proportion to their stored length, then
    transitions_per_episode of each drawn uniformly (with replacement), so every stored transition is as likely as
    in uniform replay; `replay` and `generator` as in `sample_episodes`."""
    r, device = replay, replay.device
    groups, per_group = config.batch_size // config.transitions_per_episode, config.transitions_per_episode
    first, length = sample_episodes(r, groups, H, generator)
    draws = (torch.rand(groups, per_group, generator=generator).to(device) * length.unsqueeze(1)).long()
    draws = torch.minimum(draws, length.unsqueeze(1) - 1)   # guards against rand * n rounding up to n
    needed = torch.arange(H, device=device) <= draws.max(dim=1, keepdim=True).values
    group, position = needed.nonzero(as_tuple=True)
    prefix = (first[group] + position * r.num_envs) % r.capacity
    features = transition_features(r.obs[prefix], r.actions[prefix], r.rewards[prefix], r.next_obs[prefix], L)
    drawn_group = torch.arange(groups, device=device).repeat_interleave(per_group)
    index = draws.reshape(-1)
    slots = (first[drawn_group] + index * r.num_envs) % r.capacity
    return MinibatchDraw(slots, features, group * H + position, drawn_group, index, groups)


def context_sums(draw: MinibatchDraw, mu: torch.Tensor, precision: torch.Tensor, H: int):
    """From the factors (mu, precision) of `draw.features`, the prefix sums of each drawn transition k's episode:
    (Σ precision, Σ precision·μ) over transitions 0..k-1 (the context of s_k, with gradients) and over 0..k (the
    context of s_{k+1}, detached), each (batch_size, latent_dim)."""
    groups, d = draw.groups, mu.shape[1]
    dense_precision = mu.new_zeros(groups * H, d).index_copy(0, draw.where, precision).view(groups, H, d)
    dense_weighted = mu.new_zeros(groups * H, d).index_copy(0, draw.where, mu * precision).view(groups, H, d)
    upto_precision, upto_weighted = dense_precision.cumsum(dim=1), dense_weighted.cumsum(dim=1)
    pad = mu.new_zeros(groups, 1, d)
    before_precision = torch.cat([pad, upto_precision[:, :-1]], dim=1)
    before_weighted = torch.cat([pad, upto_weighted[:, :-1]], dim=1)
    g, k = draw.group, draw.index
    return ((before_precision[g, k], before_weighted[g, k]),
            (upto_precision[g, k].detach(), upto_weighted[g, k].detach()))


class PearlDQNAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.L, self.H, self.num_actions = env_spec.L, env_spec.H, env_spec.num_actions
        self.total_steps = int(total_steps)
        self.network = PearlNetwork(env_spec, config).to(self.device)
        self.target_network = PearlNetwork(env_spec, config).to(self.device)
        self.target_network.load_state_dict(self.network.state_dict())
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate)
        if config.buffer_size < 2 * config.num_envs * env_spec.H:
            raise ValueError(f"PEARL-DQN hyperparameter buffer_size must be >= 2 * num_envs * H = "
                             f"{2 * config.num_envs * env_spec.H} (whole episodes must fit), got {config.buffer_size}")
        self.replay = EpisodeReplay(config.buffer_size, env_spec.obs_dim, config.num_envs, self.device)
        n, feature_dim = config.num_envs, 3 * env_spec.L + 1
        # per-row context of the current training episode: its transitions' encoder inputs so far
        self.context = torch.zeros(n, env_spec.H, feature_dim, device=self.device)
        self.context_length = torch.zeros(n, dtype=torch.long, device=self.device)
        self.episode_ids = torch.arange(n, dtype=torch.long, device=self.device)
        self.next_episode_id = n
        self.env_steps = 0
        self.gradient_steps = 0
        self.next_train_step = config.train_frequency
        self.next_target_step = config.target_update_frequency

    def epsilon(self) -> float:
        c = self.config
        decay_steps = max(1.0, c.exploration_fraction * self.total_steps)
        frac = min(1.0, self.env_steps / decay_steps)
        return c.epsilon_start + frac * (c.epsilon_end - c.epsilon_start)

    def context_posterior(self):
        """q(z | each row's current training episode so far): (mean, variance), each (num_envs, d)."""
        rows, position = (torch.arange(self.H, device=self.device) < self.context_length.unsqueeze(1)).nonzero(
            as_tuple=True)
        return self.network.posterior(self.context[rows, position], rows, len(self.context))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("PEARL-DQN conditions on the episode's transitions: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        mean, variance = self.context_posterior()
        z = mean + variance.sqrt() * torch.randn(mean.shape).to(self.device)
        greedy_actions = self.network.q_values(obs, z).argmax(dim=1)
        n = obs.shape[0]
        explore = torch.rand(n) < self.epsilon()
        random_actions = torch.randint(0, self.num_actions, (n,))
        return torch.where(explore.to(self.device), random_actions.to(self.device), greedy_actions)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.replay.add(obs, actions, rewards, next_obs, terminated, self.episode_ids, self.context_length)
        if bool((self.context_length >= self.H).any()):
            raise RuntimeError(f"an episode ran past the training horizon H = {self.H} without ending")
        rows = torch.arange(len(actions), device=self.device)
        self.context[rows, self.context_length] = transition_features(obs, actions, rewards, next_obs, self.L)
        self.context_length += 1
        done = terminated | truncated
        if bool(done.any()):
            ended = done.nonzero().squeeze(1)
            self.context_length[ended] = 0
            self.episode_ids[ended] = self.next_episode_id + torch.arange(len(ended), device=self.device)
            self.next_episode_id += len(ended)
        self.env_steps += len(actions)

    def update(self) -> dict:
        metrics = {}
        gradient_steps, target_updates = due_updates(self, self.config)
        for _ in range(gradient_steps):
            metrics = self._gradient_step()
        for _ in range(target_updates):
            soft_update_(self.target_network, self.network, self.config.tau)
        if metrics:
            metrics["epsilon"] = self.epsilon()
        return metrics

    def _sample(self):
        """A minibatch (`draw_minibatch`): the drawn transitions' slots and, from one encoder pass over each drawn
        episode's transitions 0..(last drawn index), their contexts' prefix sums (`context_sums`)."""
        draw = draw_minibatch(self.replay, self.config, self.H, self.L)
        return (draw.slots, *context_sums(draw, *self.network.factors(draw.features), self.H))

    def _gradient_step(self) -> dict:
        c, r = self.config, self.replay
        slots, before, upto = self._sample()
        obs, actions, rewards = r.obs[slots], r.actions[slots], r.rewards[slots]
        next_obs, terminated = r.next_obs[slots], r.terminated[slots]
        with torch.no_grad():
            next_mean, _ = posterior_from_sums(*upto)
            next_q = self.target_network.q_values(next_obs, next_mean).max(dim=1).values
            td_target = rewards + c.gamma * (1.0 - terminated) * next_q
        mean, variance = posterior_from_sums(*before)
        z = mean + variance.sqrt() * torch.randn(mean.shape).to(self.device)
        q_taken = self.network.q_values(obs, z).gather(1, actions.unsqueeze(1)).squeeze(1)
        td_loss = F.smooth_l1_loss(q_taken, td_target)
        kl = kl_to_prior(mean, variance).mean()
        loss = td_loss + c.kl_weight * kl
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.network.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        return {"td_loss": td_loss.item(), "kl": kl.item(), "q_mean": q_taken.mean().item()}

    def evaluation_policy(self) -> "PearlEvalPolicy":
        return PearlEvalPolicy(self.network)

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"network": self.network.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])

    def state_dict(self) -> dict:
        return {
            "network": self.network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "context": {"features": self.context.cpu().clone(), "length": self.context_length.cpu().clone(),
                        "episode_ids": self.episode_ids.cpu().clone()},
            "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                         "next_train_step": self.next_train_step, "next_target_step": self.next_target_step,
                         "next_episode_id": self.next_episode_id},
        }

    def load_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.context.copy_(state["context"]["features"])
        self.context_length.copy_(state["context"]["length"])
        self.episode_ids.copy_(state["context"]["episode_ids"])
        for name, value in state["counters"].items():
            setattr(self, name, value)


class PearlEvalPolicy:
    """Greedy on Q(s, posterior mean of z given the episode's transitions so far), per row.

    The posterior is kept as running sums (Σ precision_i, Σ precision_i·μ_i), so its cost per step does
    not grow with the episode; `begin` resets them (empty context = prior, mean 0). Transitions of rows
    whose episode has ended are ignored.
    """

    def __init__(self, network: PearlNetwork):
        self.network = network

    def begin(self, batch) -> None:
        n, d = len(batch), self.network.latent_dim
        device = next(self.network.parameters()).device
        self.precision_sum = torch.zeros(n, d, device=device)
        self.weighted_mean_sum = torch.zeros(n, d, device=device)
        self.active = torch.ones(n, dtype=torch.bool, device=device)

    def carry(self, batch) -> None:
        """New episodes on the same rows, the context's running sums kept (the few-shot study,
        docs/protocol.md#few-shot): the posterior over z pools the transitions of every episode since `begin`."""
        if len(batch) != self.active.shape[0]:
            raise ValueError(f"carry needs the {self.active.shape[0]} rows of the previous episodes, got {len(batch)}")
        self.active = torch.ones_like(self.active)

    def posterior_mean(self) -> torch.Tensor:
        return posterior_from_sums(self.precision_sum, self.weighted_mean_sum)[0]

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network.q_values(obs, self.posterior_mean()).argmax(dim=1)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        mu, precision = self.network.factors(transition_features(obs, actions, rewards, next_obs,
                                                                 self.network.L))
        weight = self.active.unsqueeze(1).to(mu.dtype)
        self.precision_sum += precision * weight
        self.weighted_mean_sum += mu * precision * weight
        self.active &= ~(terminated | truncated)


@dataclass
class EquivariantConfig(Config):
    """PEARL-DQN's Config with the equivariant Q-network (registry row `pearl_dqn_equivariant`)."""

    network: str = "equivariant"
    """Q-network: "mlp" (hidden_size x hidden_layers on [observation, z]) or "equivariant" (circular
    convolutions over the cells with z broadcast to every cell like t/H, Q(s, a, z) read from cell a's
    features; docs/methods/dqn_equivariant.md#equivariant-networks); the transition encoder is an MLP either way"""


def make(config: Config, env_spec, total_steps: int, device) -> PearlDQNAgent:
    return PearlDQNAgent(config, env_spec, total_steps, device)


SLICE_FIELDS = ("obs", "next_obs", "actions", "rewards", "episode", "index")


@dataclass
class ReplaySlice:
    """Seed k's part of a seed block's stacked episode replay, read as an `EpisodeReplay` (`draw_minibatch`)."""

    obs: torch.Tensor
    next_obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    episode: torch.Tensor
    index: torch.Tensor
    position: int
    size: int
    capacity: int
    num_envs: int
    device: torch.device


class PearlDQNBlock:
    """S seeds of PEARL-DQN trained as one (methods/contract.py, "Seed blocks"): stacked encoder, Q- and target
    networks, one Adam over the stacked tensors, a stacked episode replay and stacked training contexts, seed k's
    random draws from `generators[k]` only.

    Batched over the seeds: the Q-networks (on the acting batch and the minibatch, online and target), the
    element-wise posterior and reparameterisation, the replay and context bookkeeping. Per seed, where the sizes
    depend on the seed's data: the episode draws (the redraw loop), the encoder rows of each seed's contexts (one
    stacked product when every seed has as many rows), their prefix sums, and each seed's losses (its TD loss and
    KL, each its own mean, added as its single agent adds them; the seeds' losses are summed for one backward pass).
    Seed k sees exactly the numbers its single agent would.
    """

    def __init__(self, agents: list[PearlDQNAgent], generators: list[torch.Generator]):
        stacked.check_block_agents(agents, generators, PearlDQNAgent, "PearlDQNBlock", dqn.SHARED)
        first = agents[0]
        self.config, self.device, self.total_steps = first.config, first.device, first.total_steps
        self.L, self.H, self.num_actions, self.num_seeds = first.L, first.H, first.num_actions, len(agents)
        self.generators = generators
        stacked.StackedMLP.check(first.network.encoder)
        self.equivariant = first.network.equivariant
        encoder_parameters = stacked.stack_parameters([a.network.encoder for a in agents], requires_grad=True)
        q_parameters = stacked.stack_parameters([a.network.q for a in agents], requires_grad=True)
        self.parameters = encoder_parameters + q_parameters   # the order of PearlNetwork.parameters()
        self.target_parameters = stacked.stack_parameters([a.target_network for a in agents], requires_grad=False)
        self.encoder = stacked.StackedMLP(encoder_parameters)
        self.q_network = stacked.stacked_network(q_parameters, first.network.q)
        self.target_q_network = stacked.stacked_network(self.target_parameters[len(encoder_parameters):],
                                                        first.target_network.q)
        self.optimizer = stacked.SeedAdam(self.parameters, lr=self.config.learning_rate,
                                          eps=first.optimizer.param_groups[0]["eps"])
        S, capacity, obs_dim, device = self.num_seeds, self.config.buffer_size, first.replay.obs.shape[1], self.device
        self.obs = torch.zeros(S, capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(S, capacity, obs_dim, device=device)
        self.actions = torch.zeros(S, capacity, dtype=torch.long, device=device)
        self.rewards = torch.zeros(S, capacity, device=device)
        self.terminated = torch.zeros(S, capacity, device=device)
        self.episode = torch.zeros(S, capacity, dtype=torch.long, device=device)
        self.index = torch.zeros(S, capacity, dtype=torch.long, device=device)
        self.position, self.size = first.replay.position, first.replay.size
        self.context = torch.zeros(S, *first.context.shape, device=device)
        self.context_length = torch.zeros(S, *first.context_length.shape, dtype=torch.long, device=device)
        self.episode_ids = torch.zeros(S, *first.episode_ids.shape, dtype=torch.long, device=device)
        self.next_episode_id = torch.zeros(S, dtype=torch.long, device=device)
        for name in dqn.COUNTERS:
            setattr(self, name, getattr(first, name))
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    epsilon = PearlDQNAgent.epsilon

    def _q_values(self, network, obs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """(S, n, obs_dim), (S, n, latent_dim) -> (S, n, num_actions) with a stacked Q-network."""
        return network(obs, z) if self.equivariant else network(torch.cat([obs, z], dim=-1))

    def _factors(self, features: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each seed's (μ_i, precision_i) of its transitions features[k] (M_k, feature_dim): one stacked product
        where every seed has as many rows, else seed by seed."""
        if len({len(f) for f in features}) == 1:
            outputs = self.encoder(torch.stack(features)).unbind(0)
        else:
            outputs = self.encoder.each_seed(features)
        return [factors_of(out, self.config.latent_dim) for out in outputs]

    def context_posterior(self):
        """q(z | each row's current training episode so far) of every seed: (mean, variance), each (S, n, d)."""
        steps = torch.arange(self.H, device=self.device)
        rows, features = [], []
        for k in range(self.num_seeds):
            row, position = (steps < self.context_length[k].unsqueeze(1)).nonzero(as_tuple=True)
            rows.append(row)
            features.append(self.context[k, row, position])
        n = self.context.shape[1]
        posteriors = [product_of_gaussians(mu, precision, row, n)
                      for (mu, precision), row in zip(self._factors(features), rows)]
        return torch.stack([mean for mean, _ in posteriors]), torch.stack([variance for _, variance in posteriors])

    def _normal(self, shape) -> torch.Tensor:
        """(S, *shape) standard normal noise, seed k's from generators[k]."""
        return torch.stack([torch.randn(shape, generator=g) for g in self.generators]).to(self.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """obs (S, n, obs_dim) -> actions (S, n): z from each row's context posterior, then ε-greedy, seed k's
        draws from generators[k]."""
        if greedy:
            raise ValueError("PEARL-DQN conditions on the episode's transitions: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        mean, variance = self.context_posterior()
        z = mean + variance.sqrt() * self._normal(mean.shape[1:])
        greedy_actions = self._q_values(self.q_network, obs, z).argmax(dim=2)
        n, epsilon = obs.shape[1], self.epsilon()
        explore, random_actions = [], []
        for g in self.generators:
            explore.append(torch.rand(n, generator=g) < epsilon)
            random_actions.append(torch.randint(0, self.num_actions, (n,), generator=g))
        explore = torch.stack(explore).to(self.device)
        return torch.where(explore, torch.stack(random_actions).to(self.device), greedy_actions)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        n, capacity = actions.shape[1], self.config.buffer_size
        slots = ((self.position + torch.arange(n)) % capacity).to(self.device)
        self.obs[:, slots] = obs
        self.next_obs[:, slots] = next_obs
        self.actions[:, slots] = actions
        self.rewards[:, slots] = rewards
        self.terminated[:, slots] = terminated.float()
        self.episode[:, slots] = self.episode_ids
        self.index[:, slots] = self.context_length
        self.position = (self.position + n) % capacity
        self.size = min(capacity, self.size + n)
        if bool((self.context_length >= self.H).any()):
            raise RuntimeError(f"an episode ran past the training horizon H = {self.H} without ending")
        seeds = torch.arange(self.num_seeds, device=self.device).unsqueeze(1)
        rows = torch.arange(n, device=self.device)
        self.context[seeds, rows, self.context_length] = transition_features(obs, actions, rewards, next_obs, self.L)
        self.context_length += 1
        done = terminated | truncated
        if bool(done.any()):
            self.context_length[done] = 0
            order = done.long().cumsum(dim=1) - 1   # new ids in row order, as the single agent numbers them
            self.episode_ids = torch.where(done, self.next_episode_id.unsqueeze(1) + order, self.episode_ids)
            self.next_episode_id += done.sum(dim=1)
        self.env_steps += n

    def update(self) -> list[dict]:
        return dqn.block_update(self, self.parameters, self.target_parameters)

    def _replay_slice(self, k: int) -> ReplaySlice:
        return ReplaySlice(*(getattr(self, name)[k] for name in SLICE_FIELDS), position=self.position,
                           size=self.size, capacity=self.config.buffer_size, num_envs=self.context.shape[1],
                           device=self.device)

    def _gradient_step(self) -> list[dict]:
        c, S, capacity = self.config, self.num_seeds, self.config.buffer_size
        draws = [draw_minibatch(self._replay_slice(k), c, self.H, self.L, g) for k, g in enumerate(self.generators)]
        sums = [context_sums(draw, mu, precision, self.H)
                for draw, (mu, precision) in zip(draws, self._factors([d.features for d in draws]))]
        before = tuple(torch.stack(parts) for parts in zip(*(b for b, _ in sums)))   # each (S, batch_size, d)
        upto = tuple(torch.stack(parts) for parts in zip(*(u for _, u in sums)))
        slots = torch.stack([draw.slots for draw in draws])
        rows = (slots + capacity * torch.arange(S, device=self.device).unsqueeze(1)).view(-1)   # into S * capacity
        take = lambda x: x.view(S * capacity, *x.shape[2:]).index_select(0, rows).view(*slots.shape, *x.shape[2:])
        obs, actions, rewards, next_obs, terminated = (take(x) for x in (
            self.obs, self.actions, self.rewards, self.next_obs, self.terminated))
        with torch.no_grad():
            next_mean, _ = posterior_from_sums(*upto)
            next_q = self._q_values(self.target_q_network, next_obs, next_mean).max(dim=2).values
            td_target = rewards + c.gamma * (1.0 - terminated) * next_q
        mean, variance = posterior_from_sums(*before)
        z = mean + variance.sqrt() * self._normal(mean.shape[1:])
        q_taken = self._q_values(self.q_network, obs, z).gather(2, actions.unsqueeze(2)).squeeze(2)
        td_losses, kls = [], []
        for q_k, target_k, mean_k, variance_k in zip(q_taken.unbind(0), td_target.unbind(0), mean.unbind(0),
                                                      variance.unbind(0)):
            td_losses.append(F.smooth_l1_loss(q_k, target_k))   # each seed's own means, as its single agent's
            kls.append(kl_to_prior(mean_k, variance_k).mean())
        losses = [td + c.kl_weight * kl for td, kl in zip(td_losses, kls)]
        self.optimizer.zero_grad()
        torch.stack(losses).sum().backward()   # a sum: seed k's gradient is d loss_k, never an average over seeds
        stacked.clip_grad_norm_per_seed_(self.parameters, c.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        q_taken = q_taken.detach()
        return [{"td_loss": td.item(), "kl": kl.item(), "q_mean": q_taken[k].mean().item()}
                for k, (td, kl) in enumerate(zip(td_losses, kls))]

    # --- one seed in and out of the block ------------------------------------------------------------
    def export_seed(self, k: int, agent: PearlDQNAgent) -> None:
        """Write seed k's complete training state into `agent` (what a one-seed run holds at this step)."""
        stacked.write_parameters(self.parameters, k, agent.network)
        stacked.write_parameters(self.target_parameters, k, agent.target_network)
        stacked.export_adam_state(self.optimizer, self.parameters, k, agent.optimizer, list(agent.network.parameters()))
        replay, n = agent.replay, self.size
        for name in EpisodeReplay.FIELDS:
            getattr(replay, name)[:n] = getattr(self, name)[k, :n]
        replay.position, replay.size = self.position, n
        agent.context.copy_(self.context[k])
        agent.context_length.copy_(self.context_length[k])
        agent.episode_ids.copy_(self.episode_ids[k])
        agent.next_episode_id = int(self.next_episode_id[k])
        for name in dqn.COUNTERS:
            setattr(agent, name, getattr(self, name))

    def import_seed(self, k: int, agent: PearlDQNAgent) -> None:
        """Write `agent`'s complete training state into seed k (resume); its counters must be the block's."""
        stacked.check_same_step(k, dqn.block_step(agent), dqn.block_step(self))
        stacked.read_parameters(self.parameters, k, agent.network)
        stacked.read_parameters(self.target_parameters, k, agent.target_network)
        stacked.import_adam_state(self.optimizer, self.parameters, k, agent.optimizer, list(agent.network.parameters()))
        n = self.size
        for name in EpisodeReplay.FIELDS:
            getattr(self, name)[k, :n] = getattr(agent.replay, name)[:n]
        self.context[k] = agent.context
        self.context_length[k] = agent.context_length
        self.episode_ids[k] = agent.episode_ids
        self.next_episode_id[k] = agent.next_episode_id


def make_block(agents: list[PearlDQNAgent], generators: list[torch.Generator]) -> PearlDQNBlock:
    """S PEARL-DQN agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return PearlDQNBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
