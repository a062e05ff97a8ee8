"""PPO (context) (docs/methods.md#ppo-context): the equivariant PPO with the rule features of the episode so far as
extra channels of every cell.

The context is the soft rule table of the in-context world model (`context_model.context_counts`): every
transition the episode has shown writes its cells' next values under their windows. Its features are, for each of
the k^(2r+1) windows, whether the context showed it and the frequency of each next value (0 where it did not):
E·(k + 1) numbers per row (24 for the elementary family), broadcast to every cell as extra input channels of the
equivariant actor and critic (`equivariant.EquivariantTrunk`'s `extra`, as PEARL-DQN's task latent), so the network
can read the table and look up the windows of the tape it sees with the same weights at every cell. The features
are a sum over cells and transitions: they commute with shifts of the tape and do not depend on the transitions'
order, so the policy stays shift-equivariant.

Everything else is `ppo_equivariant`'s (`ppo.py`: its Config fields and defaults, rollouts, GAE, clipped loss). The
training agent keeps each environment row's context (emptied when the row's episode ends) and stores the augmented
observations [observation, features] in its rollout; the evaluation policy (`evaluation_policy()`) keeps one per
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
from tapebench.methods.context_model import context_counts, increment
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


def feature_count(family: RuleFamily) -> int:
    return family.neighbourhoods * (family.k + 1)


def table_features(counts: torch.Tensor) -> torch.Tensor:
    """(N, E, k) counts -> (N, E·(k+1)) features: per window, shown (0/1), then each next value's frequency."""
    total = counts.sum(-1, keepdim=True)
    return torch.cat([(total > 0).float(), counts / total.clamp_min(1.0)], dim=-1).flatten(1)


class SplitInput(nn.Module):
    """An equivariant network on augmented observations [observation (obs_dim), features]: the features are its
    `extra` channels."""

    def __init__(self, network: nn.Module, obs_dim: int):
        super().__init__()
        self.network, self.obs_dim = network, obs_dim

    def forward(self, augmented: torch.Tensor) -> torch.Tensor:
        return self.network(augmented[..., :self.obs_dim], augmented[..., self.obs_dim:])


class ContextActorCritic(ActorCritic):
    def __init__(self, config: Config, env_spec, extra: int):
        nn.Module.__init__(self)

        def make(builder):
            return lambda c, spec, activation: builder(c, spec, extra=extra, activation=activation)

        self.actor = SplitInput(equivariant_network(make(equivariant.per_cell_network), config, env_spec, 0.01),
                                env_spec.obs_dim)
        self.critic = SplitInput(equivariant_network(make(equivariant.pooled_network), config, env_spec, 1.0),
                                 env_spec.obs_dim)


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
        counts = self.counts if counts is None else counts
        return torch.cat([obs.to(self.device), table_features(counts)], dim=-1)

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
        self.obs_dim, extra = env_spec.obs_dim, feature_count(self.family)
        self.network = ContextActorCritic(config, env_spec, extra).to(self.device)
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
