"""PPO (context) (docs/methods.md#ppo-context): the equivariant PPO with what the episode so far says about the rule
as extra input channels of every cell.

The context is the soft rule table of the in-context world model (`context_model.context_counts`): every
transition the episode has shown writes its cells' next values under their windows. A looked-up window gives k
numbers: whether the context showed it and the frequencies of next values 1..k-1 (0 where it did not). Cell a gets
k·(2r + 2) channels (8 for the elementary family): the lookup of its own window in the tape (what a step without
acting near it does), then of the windows of cells a-r..a+r once a is incremented (what acting on a does to its
neighbourhood, as far as the context has seen). The lookups commute with shifts of the tape and the table does not
depend on the transitions' order, so the actor stays shift-equivariant: cell a's logit is read from cell a's
features, and those see a's own channels.

Everything else is `ppo_equivariant`'s (`ppo.py`: its Config fields and defaults, rollouts, GAE, clipped loss). The
training agent keeps each environment row's context (emptied when the row's episode ends) and stores the augmented
observations [observation, channels] in its rollout; the evaluation policy (`evaluation_policy()`) keeps one per
episode, empty at `begin`, each observed transition of a running episode added. No seed blocks: seeds train one
after another.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from tapebench.methods import equivariant
from tapebench.methods.common import adam
from tapebench.methods.context_model import context_counts, increment, windows
from tapebench.methods.ppo import ActorCritic, EquivariantConfig, PPOAgent, Rollout, equivariant_network
from tapebench.rule_family import RuleFamily


@dataclass
class Config(EquivariantConfig):
    colours: int = 2
    """k of the rule family the context is read in (cells 0..k-1); must be the split's family (2: elementary)"""
    radius: int = 1
    """r of the rule family the context is read in (windows of 2r + 1 cells); must be the split's family"""

    def check(self) -> None:
        super().check()
        RuleFamily(self.colours, self.radius)
        if self.network != "equivariant":
            raise ValueError(f"PPO (context) hyperparameter network must be 'equivariant', got {self.network!r}")


def feature_channels(family: RuleFamily) -> int:
    """Context channels per cell: k per looked-up window (shown, then the frequencies of next values 1..k-1), for
    the cell's own window and for the 2r + 1 windows the increment of the cell changes: k·(2r + 2)."""
    return family.k * (2 * family.r + 2)


def window_features(counts: torch.Tensor) -> torch.Tensor:
    """(N, E, k) counts -> (N, E, k): per window, shown (0/1), then the frequencies of next values 1..k-1."""
    total = counts.sum(-1, keepdim=True)
    return torch.cat([(total > 0).float(), counts[..., 1:] / total.clamp_min(1.0)], dim=-1)


def cell_features(tapes: torch.Tensor, counts: torch.Tensor, k: int, r: int) -> torch.Tensor:
    """(N, k·(2r+2), L) context channels of every cell a: the table's features of a's own window in the tape, then
    of the windows of cells a-r..a+r once cell a is incremented (what acting on a does, as the context has seen it).
    Rolling the tape by s rolls the channels by s."""
    features = window_features(counts)                                        # (N, E, k)
    index = windows(tapes, k, r)                                              # (N, L)
    delta = (tapes.long() + 1) % k - tapes.long()                             # the increment's change at a
    looked = [index] + [torch.roll(index, -j, dims=1) + delta * k ** (r + j) for j in range(-r, r + 1)]
    rows = torch.stack(looked, dim=1)                                         # (N, 2r+2, L)
    n, w, L = rows.shape
    picked = features.gather(1, rows.reshape(n, w * L, 1).expand(-1, -1, k))  # (N, (2r+2)·L, k)
    return picked.view(n, w, L, k).permute(0, 1, 3, 2).reshape(n, w * k, L)


class ContextNetwork(nn.Module):
    """The equivariant trunk on per-cell inputs [cell, (goal's cell,) t/H, context channels] and a per-cell head (the
    actor: cell a's logit from cell a's features) or a pooled head (the critic), tanh and orthogonal init as PPO's.
    Input: augmented observations [observation (obs_dim), context channels (C·L, channel-major)]."""

    def __init__(self, config, env_spec, channels: int, pooled: bool, out_std: float):
        super().__init__()
        self.obs_dim, self.L, self.channels, self.pooled = env_spec.obs_dim, env_spec.L, channels, pooled
        own = 3 if env_spec.obs_dim == 2 * env_spec.L + 1 else 2
        builder = equivariant.pooled_network if pooled else equivariant.per_cell_network
        network = equivariant_network(lambda c, spec, activation: builder(c, spec, activation=activation,
                                                                          in_channels=own + channels),
                                      config, env_spec, out_std)
        self.trunk, self.head = network.trunk, network.head

    def forward(self, augmented: torch.Tensor) -> torch.Tensor:
        obs = augmented[..., :self.obs_dim]
        context = augmented[..., self.obs_dim:].reshape(*augmented.shape[:-1], self.channels, self.L)
        h = self.trunk.cells(torch.cat([self.trunk.observation_channels(obs), context], dim=-2))
        return self.head(h.mean(dim=-1)) if self.pooled else self.head(h).squeeze(-2)


class ContextActorCritic(ActorCritic):
    def __init__(self, config: Config, env_spec, channels: int):
        nn.Module.__init__(self)
        self.actor = ContextNetwork(config, env_spec, channels, pooled=False, out_std=0.01)
        self.critic = ContextNetwork(config, env_spec, channels, pooled=True, out_std=1.0)


class ContextReader:
    """Per-row contexts (counts) and the augmented observations they give."""

    def __init__(self, family: RuleFamily, L: int, rows: int, device: torch.device):
        self.family, self.L, self.device = family, L, device
        self.counts = torch.zeros(rows, family.neighbourhoods, family.k, device=device)

    def tapes(self, obs: torch.Tensor) -> torch.Tensor:
        tapes = obs[:, :self.L].to(self.device).round().long()
        if len(tapes) and (tapes.min() < 0 or tapes.max() >= self.family.k):
            raise ValueError(f"PPO (context) reads k = {self.family.k} colours (hyperparameter colours) but the tape "
                             f"holds values up to {int(tapes.max())}; set agents.ppo_context.colours to the split's "
                             f"family")
        return tapes

    def augment(self, obs: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """[observation, the context channels of every cell (flattened)]."""
        counts = self.counts if counts is None else counts
        channels = cell_features(self.tapes(obs), counts, self.family.k, self.family.r)
        return torch.cat([obs.to(self.device), channels.flatten(1)], dim=-1)

    def after(self, obs, actions, next_obs, rows=None) -> torch.Tensor:
        """The counts with each row's transition added (only `rows`, (N,) bool, when given)."""
        k, r = self.family.k, self.family.r
        post = increment(self.tapes(obs), actions.to(self.device), k)
        valid = None if rows is None else rows.to(self.device)[:, None]
        return self.counts + context_counts(post[:, None], self.tapes(next_obs)[:, None], k, r, valid)


class PPOContextAgent(PPOAgent):
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        if env_spec.grid is not None:
            raise ValueError("PPO (context) reads 1D tapes (windows of 2r + 1 cells), not the 2D grid family")
        self.config, self.device = config, torch.device(device)
        self.family = RuleFamily(config.colours, config.radius)
        channels = feature_channels(self.family)
        extra = channels * env_spec.L
        self.network = ContextActorCritic(config, env_spec, channels).to(self.device)
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate, eps=1e-5)
        self.rollout = Rollout(config.num_steps, config.num_envs, env_spec.obs_dim + extra, self.device)
        self.num_updates = max(1, math.ceil(total_steps / (config.num_envs * config.num_steps)))
        self.updates_done = 0
        self._pending = None
        self.context = ContextReader(self.family, env_spec.L, config.num_envs, self.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("PPO (context) reads the episode so far: evaluate it through evaluation_policy(), not "
                             "act(obs, greedy=True)")
        return super().act(self.context.augment(obs)).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        following = self.context.after(obs, actions, next_obs)
        augmented_next = self.context.augment(next_obs, following)   # the successor as the episode has shown it
        super().observe(self.context.augment(obs), actions.to(self.device), rewards.to(self.device), augmented_next,
                        terminated.to(self.device), truncated.to(self.device))
        following[(terminated | truncated).to(self.device)] = 0.0     # a row whose episode ended starts afresh
        self.context.counts = following

    def evaluation_policy(self) -> "ContextPolicy":
        return ContextPolicy(self.network.actor, self.family, self.device)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "counts": self.context.counts.cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.context.counts = state["counts"].to(self.device).clone()


class ContextPolicy:
    """The greedy actor on [observation, the episode's rule features] (an EvalPolicy)."""

    def __init__(self, actor: nn.Module, family: RuleFamily, device):
        self.actor, self.family, self.device = actor, family, torch.device(device)

    def begin(self, batch) -> None:
        family = batch.family or RuleFamily()
        if not isinstance(family, RuleFamily) or (family.k, family.r) != (self.family.k, self.family.r):
            what = family.describe() if hasattr(family, "describe") else repr(family)
            raise ValueError(f"PPO (context) evaluation: the context is read in k = {self.family.k}, r = "
                             f"{self.family.r} (hyperparameters colours, radius), not {what}")
        self.context = ContextReader(self.family, batch.L, len(batch), self.device)
        self.active = torch.ones(len(batch), dtype=torch.bool, device=self.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self.context.augment(obs)).argmax(dim=1).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.context.counts = self.context.after(obs, actions, next_obs, self.active)
        self.active &= ~(terminated | truncated).to(self.device)


def make(config: Config, env_spec, total_steps: int, device) -> PPOContextAgent:
    return PPOContextAgent(config, env_spec, total_steps, device)
