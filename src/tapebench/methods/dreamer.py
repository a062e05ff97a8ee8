"""DreamerV3-style agent (Hafner et al., 2023): a world model and an actor-critic trained in imagination.

World model: the RSSM of `world_model.py` (categorical latents, Bernoulli tape decoder, symlog two-hot
reward head, continue head, balanced KL with free bits), trained on chunks of a sequence replay.

Actor-critic, trained on imagined rollouts: from the posterior state of every step of the replayed
chunks, the actor (a categorical over the L cells, 1% unimix) and the prior (sampled) roll out
`imagination_horizon` steps; the reward and continue heads give the imagined rewards and continues.
λ-returns bootstrap from a slow (EMA) copy of the critic; the critic (symlog two-hot) regresses them;
the actor follows REINFORCE on the advantages (λ-return minus the critic's value) divided by
max(1, S), S the EMA of the 5th-95th percentile range of the λ-returns (DreamerV3's return
normalisation), with an entropy bonus. Imagined steps are weighted by the cumulative product of the
discount and predicted continues, so reaching the goal ends an imagined trajectory's contribution.

Small preset for L = 32 (the Config defaults): h 128, z 32 x 4 categoricals, MLPs with one hidden
layer of 128, batch 16 chunks x 32 steps, train ratio 16 replayed steps per environment step (one
world-model and one actor-critic update every 32 environment steps), imagination from 256 of the 512
replayed posterior states. DreamerV3's own presets are far larger (h >= 512, train ratio 32-1024);
this one trained at ~400 environment steps/s on one CPU thread in one session and at ~240 in a later one on
the same code (200k steps in 8.5-14 minutes; docs/methods/dreamer.md).

In the multi-goal protocol (observations [s, g, t/H]) the world model predicts the tape as with the fixed goal, and
the reward and continue heads, the actor and the critic read the episode's goal beside [h, z] (`RSSM.head_input`):
an imagined trajectory keeps its start state's goal, so its imagined rewards score distance to that goal.

Acting in training samples the posterior and the actor; each row keeps its deterministic state h,
reset to zeros when its episode ends. Evaluation (`evaluation_policy()`) keeps h per row (reset in
`begin`), takes the posterior mode and the actor's most likely cell: deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tapebench.methods.common import adam, soft_update_
from tapebench.methods.world_model import (RSSM, VALUE_BINS, VALUE_GRID, WorldModelConfig, WorldModelLearner,
                                           class_major_probs, class_major_sample, filter_mode, metric_values, mlp,
                                           sample_index, sample_straight_through, softmax, to_class_major,
                                           unimix_logits, world_model_rollout)


@dataclass
class Config(WorldModelConfig):
    imagination_horizon: int = 15
    """imagined steps per actor-critic update (DreamerV3: 15)"""
    imagination_starts: int = 256
    """posterior states of the replayed chunk that start imagined rollouts (a random subset of the
    batch_size * sequence_length states; all of them when larger)"""
    gamma: float = 0.97
    """discount of the imagined returns (horizon ~ 33 steps, about H = 32)"""
    lambda_: float = 0.95
    """λ of the λ-returns"""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic"""
    ent_coef: float = 3e-4
    """entropy bonus of the actor (on returns normalised by max(1, S))"""
    slow_critic_tau: float = 0.02
    """rate of the slow target critic's EMA per update"""
    return_norm_decay: float = 0.99
    """EMA decay of the 5th-95th percentile range S of the λ-returns"""
    ac_grad_clip: float = 100.0
    """gradient-norm clipping threshold of the actor and of the critic"""

    def check(self) -> None:
        super().check("DreamerV3")
        for name in ("imagination_horizon", "imagination_starts"):
            if getattr(self, name) < 1:
                raise ValueError(f"DreamerV3 hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "lambda_", "slow_critic_tau", "return_norm_decay"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DreamerV3 hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        if self.ent_coef < 0:
            raise ValueError(f"DreamerV3 hyperparameter ent_coef must be >= 0, got {self.ent_coef}")
        for name in ("actor_lr", "critic_lr", "ac_grad_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DreamerV3 hyperparameter {name} must be > 0, got {getattr(self, name)}")


def lambda_returns(rewards, conts, values, gamma: float, lam: float) -> torch.Tensor:
    """λ-returns R_j, j = 0..T-1, of an imagined trajectory: rewards[j], conts[j] belong to the step into
    state j+1, values (T+1, N) to the states 0..T. R_{T} = v_T and
    R_j = r_{j+1} + γ c_{j+1} ((1 - λ) v_{j+1} + λ R_{j+1})."""
    T = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    last = values[T]
    for j in reversed(range(T)):
        last = rewards[j] + gamma * conts[j] * ((1.0 - lam) * values[j + 1] + lam * last)
        returns[j] = last
    return returns


class ReturnNormalizer:
    """DreamerV3's return scale: S = EMA of the 95th minus the 5th percentile of the returns; divide by max(1, S)."""

    def __init__(self, decay: float):
        self.decay, self.range = decay, torch.zeros(())

    def update(self, returns: torch.Tensor) -> torch.Tensor:
        flat = returns.detach().flatten().float().cpu()
        low, high = torch.quantile(flat, torch.tensor([0.05, 0.95]))    # one sort for both
        spread = high - low
        self.range = self.decay * self.range + (1.0 - self.decay) * spread
        return self.scale()

    def scale(self) -> torch.Tensor:
        return torch.clamp(self.range, min=1.0)


class DreamerAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.num_actions = env_spec.num_actions
        self.learner = WorldModelLearner(config, env_spec, self.device)
        self.model: RSSM = self.learner.model
        feat = self.model.head_size   # [h, z] and, in the multi-goal protocol, the episode's goal
        self.actor = mlp(feat, env_spec.num_actions, config.hidden_size).to(self.device)
        self.critic = mlp(feat, VALUE_BINS, config.hidden_size, zero_out=True).to(self.device)
        self.slow_critic = mlp(feat, VALUE_BINS, config.hidden_size, zero_out=True).to(self.device)
        self.slow_critic.load_state_dict(self.critic.state_dict())
        self.actor_optimizer = adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_optimizer = adam(self.critic.parameters(), lr=config.critic_lr)
        self.normalizer = ReturnNormalizer(config.return_norm_decay)
        self.h = self.model.initial(config.num_envs, self.device)   # per row: the state before its observation
        self._pending = None

    def actor_logits(self, feat: torch.Tensor) -> torch.Tensor:
        return unimix_logits(self.actor(feat), self.config.unimix)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("DreamerV3 keeps a recurrent state per episode: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        post = self.model.posterior(self.h, self.model.encode(obs))
        z = self.model.flat(sample_straight_through(post))
        logits = self.actor_logits(self.model.head_input(self.model.features(self.h, z), self.model.goal_of(obs)))
        actions = sample_index(logits.exp())
        self._pending = z
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("DreamerV3 observe() needs the preceding act(obs, greedy=False)")
        z, self._pending = self._pending, None
        self.learner.add(obs, actions, rewards, next_obs, terminated, truncated)
        h = self.model.transition(self.h, z, actions)
        self.h = h * (~(terminated | truncated)).to(h.dtype).unsqueeze(1)   # a new episode starts from h = 0

    def update(self) -> dict:
        metrics = {}
        for _ in range(self.learner.due()):
            metrics, states = self.learner.update()
            metrics.update(self.actor_critic_update(*states))
        return metrics

    @torch.no_grad()
    def imagine(self, h, z, goal=None):
        """Roll the actor and the prior (sampled) forward from the start states (z flat group-major; `goal` (N, L)
        each one's goal in the multi-goal protocol, else None): features (T+1, N, F) and actions (T, N).

        Written into one preallocated feature tensor; the latents are held class-major inside the
        loop (`class_major_probs`), the uniforms of all samples are drawn at once."""
        model, c = self.model, self.config
        G, K, D, T, N = model.groups, model.classes, model.deter_size, c.imagination_horizon, len(h)
        w = model.unroll_weights()
        action_in = model.action_inputs(w, torch.arange(self.num_actions, device=h.device))   # (A, H)
        feats = torch.empty(T + 1, N, model.feat_size, device=h.device)
        feats[0, :, :D], feats[0, :, D:] = h, z
        actions = torch.empty(T, N, dtype=torch.long, device=h.device)
        uniform_action = torch.rand(T, N, 1, device=h.device)
        uniform_latent = torch.rand(T, N, 1, G, device=h.device)
        z = to_class_major(z, G, K)
        for j in range(T):
            probs = softmax(self.actor(model.head_input(feats[j], goal)))
            if c.unimix > 0:
                probs = probs * (1.0 - c.unimix) + c.unimix / self.num_actions
            a = (uniform_action[j] > probs[:, :-1].cumsum(-1)).sum(-1)
            h = model.img_step(w, h, z, action_in[a])
            sample = class_major_sample(class_major_probs(model.prior_raw(w, h), K, c.unimix), uniform_latent[j])
            z = sample.reshape(N, K * G)
            feats[j + 1, :, :D] = h
            feats[j + 1, :, D:].view(N, G, K).copy_(sample.transpose(1, 2))   # a view: writes into feats
            actions[j] = a
        return feats, actions

    def actor_critic_update(self, h, z, start_weight, goal=None) -> dict:
        """`goal` (N, L): each start state's goal in the multi-goal protocol; the imagined rewards and continues,
        the actor and the critic read it beside every imagined state of its trajectory."""
        c = self.config
        if c.imagination_starts < len(h):
            pick = torch.randperm(len(h))[:c.imagination_starts].to(h.device)
            h, z, start_weight = h[pick], z[pick], start_weight[pick]
            goal = goal[pick] if goal is not None else None
        feats, actions = self.imagine(h, z, goal)
        scored = self.model.head_input(feats, goal)     # feats with each trajectory's goal (the fixed goal: feats)
        with torch.no_grad():
            rewards = self.model.reward(feats[1:], goal)
            conts = self.model.cont(feats[1:], goal)
            # the λ-returns read the values of the states 1..T only: v_0 is not computed (v_1 holds its place)
            target_values = VALUE_GRID.mean(self.slow_critic(scored[1:]))
            returns = lambda_returns(rewards, conts, torch.cat([target_values[:1], target_values]), c.gamma, c.lambda_)
            discount = torch.cumprod(torch.cat([torch.ones_like(conts[:1]), c.gamma * conts[:-1]]), 0)
            weight = discount * start_weight
            scale = self.normalizer.update(returns).to(returns.device)
        critic_logits = self.critic(scored[:-1])
        values = VALUE_GRID.mean(critic_logits).detach()
        advantages = (returns - values) / scale
        logits = self.actor_logits(scored[:-1])
        logp = logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        entropy = -(logits.exp() * logits).sum(-1)
        actor_loss = -(weight * (logp * advantages + c.ent_coef * entropy)).mean()
        critic_loss = (weight * VALUE_GRID.loss(critic_logits, returns)).mean()
        for loss, net, opt in ((actor_loss, self.actor, self.actor_optimizer),
                               (critic_loss, self.critic, self.critic_optimizer)):
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), c.ac_grad_clip)
            opt.step()
        soft_update_(self.slow_critic, self.critic, c.slow_critic_tau)
        return metric_values({"actor_loss": actor_loss, "critic_loss": critic_loss, "entropy": entropy.mean(),
                              "return_scale": scale, "imagined_return": returns[0].mean()})

    # --- evaluation and the world-model contract ----------------------------------------------
    def evaluation_policy(self) -> "DreamerEvalPolicy":
        return DreamerEvalPolicy(self.model, self.actor)

    def world_model_rollout(self, obs_prefix, action_prefix, actions, repeat: int = 1) -> torch.Tensor:
        return world_model_rollout(self.model, obs_prefix, action_prefix, actions, repeat)

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "actor": self.actor.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.actor.load_state_dict(state["actor"])

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict(), "actor": self.actor.state_dict(),
                "critic": self.critic.state_dict(), "slow_critic": self.slow_critic.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "return_range": self.normalizer.range.clone(), "h": self.h.cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.slow_critic.load_state_dict(state["slow_critic"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.normalizer.range = state["return_range"].clone()
        self.h = state["h"].to(self.device).clone()


class DreamerEvalPolicy:
    """Per row: h (reset in `begin`), the posterior mode of z, the actor's most likely cell."""

    def __init__(self, model: RSSM, actor: nn.Module):
        self.model, self.actor = model, actor
        self.h = self._z = None

    def begin(self, batch) -> None:
        self.h = self.model.initial(len(batch), next(self.model.parameters()).device)
        self._z = None

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        self._z = filter_mode(self.model, self.h, obs)
        return self.actor(self.model.head_input(self.model.features(self.h, self._z),
                                                self.model.goal_of(obs))).argmax(dim=1)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        # rows whose episode ended are stepped on with frozen records; their state no longer matters
        self.h = self.model.transition(self.h, self._z, actions)
        self._z = None


@dataclass
class LargeConfig(Config):
    """DreamerV3 with twice the world model's widths and four times the train ratio (registry row
    `dreamer_large`): the two settings that lower the world model's one-step error (docs/methods/dreamer_large.md), at about eight times the CPU time of the defaults."""

    deter_size: int = 256
    """size of the deterministic GRU state h (defaults: 128)"""
    hidden_size: int = 256
    """width of the hidden layer of every MLP, the actor's and critic's too (defaults: 128)"""
    train_ratio: int = 64
    """replayed steps per environment step: one world-model and one actor-critic update every 8 environment
    steps (defaults: 16, every 32)"""


def make(config: Config, env_spec, total_steps: int, device) -> DreamerAgent:
    return DreamerAgent(config, env_spec, total_steps, device)

