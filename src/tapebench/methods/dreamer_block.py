"""Seed blocks of the DreamerV3-style agent (`dreamer.py`): S seeds trained as one stacked model, the world model
as `world_model_block.WorldModelBlock` stacks it, plus the actor, the critic and the slow critic.

The seed-block contract (`training/blocks.py`): every parameter of the world model, the actor, the critic and
the slow critic is held with a leading seed dimension S and every layer is a batched product (`torch.baddbmm`;
the GRU cell written out with stacked weights; layer norms per seed through `addcmul`, bit for bit what
`nn.LayerNorm` computes). The replay is one stacked ring (S, rows, capacity, ...); the one-seed agents' replay
fields are views of it, so it is not held twice. Seed k draws every random number (replay chunks, latent and
action samples, imagination starts) from its own generator, in the order and shapes its one-seed agent draws
them from torch's global generator. Per-seed losses are summed over seeds for one backward pass; gradient-norm
clipping and the return normalisation (percentile EMA) are per seed; one `stacked.SeedAdam` per optimiser
(each seed's slices stepped as tensors of their own).

The computation is the one-seed agent's (`dreamer.py`, `world_model.py`) rewritten over stacked tensors, not
shared code: a change to the one-seed agent must be made here too; `tests/test_seed_blocks_dreamer.py` compares
the two on every update and checkpoint. On a CUDA device the random numbers are drawn on the CPU from the seeds'
generators and moved (a one-seed CUDA run draws from the CUDA generator instead).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tapebench.methods.dreamer import DreamerAgent, lambda_returns
from tapebench.methods.stacked import clip_grad_norm_per_seed_
from tapebench.methods.world_model import (REWARD_GRID, VALUE_GRID, class_major_probs, softmax, to_class_major,
                                           unimix_logits)
from tapebench.methods.world_model_block import WorldModelBlock, class_major_sample, mlp, sample_index

# seeds per group of the actor-critic update's passes (imagination is compute-bound: small groups keep its working
# set in cache)
ACTOR_CRITIC_GROUP = 2


class DreamerBlock(WorldModelBlock):
    """S DreamerV3 agents of one configuration as one stacked model (the seed-block contract)."""

    label = "DreamerV3"
    agent_type = DreamerAgent
    NETS = ("model", "actor", "critic", "slow_critic")
    FROZEN_NETS = ("slow_critic",)
    OPTIMISERS = {"model": "learner.optimizer", "actor": "actor_optimizer", "critic": "critic_optimizer"}

    def stack_agent_state(self, agents: list) -> None:
        self.return_range = torch.stack([a.normalizer.range for a in agents])
        self.h = torch.stack([a.h for a in agents])
        self._pending = None

    # --- acting -----------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        S, n = obs.shape[:2]
        post = self._posterior(self.h, mlp(self._net("model"), "encoder.", obs))
        probs = post.exp()
        index = sample_index(probs, self._rand_same(n, self.G, 1))
        sample = F.one_hot(index, self.K).to(probs.dtype)
        z = (sample + probs - probs).reshape(S, n, self.Z)       # what sample_straight_through gives
        feat = torch.cat([self.h, z], dim=-1)
        logits = unimix_logits(mlp(self._net("actor"), "", feat), self.config.unimix)
        actions = sample_index(logits.exp(), self._rand_same(n, 1))
        self._pending = z
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("DreamerV3 block observe() needs the preceding act(obs)")
        z, self._pending = self._pending, None
        self._store(obs, actions, rewards, next_obs, terminated, truncated)
        h = self._transition(self.h, z, actions)
        self.h = h * (~(terminated | truncated)).to(h.dtype).unsqueeze(-1)

    # --- learning ---------------------------------------------------------------------------------
    def update(self) -> list:
        metrics = [{} for _ in range(self.S)]
        for _ in range(self.due()):
            wm_metrics, states = self._world_model_update()
            ac_metrics = self._actor_critic_update(states)
            metrics = [{**a, **b} for a, b in zip(wm_metrics, ac_metrics)]
        return metrics

    def _imagine(self, h, z):
        """`DreamerAgent.imagine` stacked: features (T+1, S, N, F), actions (T, S, N) and the actor's raw outputs
        (T, S, N, A) at the features 0..T-1, with gradients to the actor (the actor loss reuses them: the one-seed
        agent computes them a second time)."""
        c, S, N = self.config, h.shape[0], h.shape[1]
        G, K, D, T, A = self.G, self.K, self.D, c.imagination_horizon, self.num_actions
        actor = self._net("actor")
        with torch.no_grad():
            w = self._unroll_weights()
            seeds = torch.arange(S, device=h.device).unsqueeze(1)
            action_in = self._action_inputs(w, torch.arange(A, device=h.device).expand(S, A))   # (S, A, H)
            feats = torch.empty(T + 1, S, N, D + self.Z, device=h.device)
            feats[0, :, :, :D], feats[0, :, :, D:] = h, z
            actions = torch.empty(T, S, N, dtype=torch.long, device=h.device)
            uniform_action = self._rand_same(T, N, 1).transpose(0, 1)                 # (T, S, N, 1)
            uniform_latent = self._rand_same(T, N, 1, G).transpose(0, 1)              # (T, S, N, 1, G)
            z = to_class_major(z, G, K)
        raws = []
        for j in range(T):
            raws.append(mlp(actor, "", feats[j].clone()))   # a copy: feats is written on below
            with torch.no_grad():
                probs = softmax(raws[j].detach())
                if c.unimix > 0:
                    probs = probs * (1.0 - c.unimix) + c.unimix / A
                a = (uniform_action[j] > probs[..., :-1].cumsum(-1)).sum(-1)          # (S, N)
                x = self._ln_silu(torch.baddbmm(action_in[seeds, a], z, w["img_zT"]), "img_in.1")
                h = self._gru(x, h, w["gru"])
                sample = class_major_sample(class_major_probs(self._prior_raw(w, h), K, c.unimix),
                                            uniform_latent[j])
                z = sample.reshape(S, N, K * G)
                feats[j + 1, :, :, :D] = h
                feats[j + 1, :, :, D:].view(S, N, G, K).copy_(sample.transpose(-1, -2))
                actions[j] = a
        return feats, actions, torch.stack(raws)

    def _actor_critic_update(self, states: list) -> list:
        """One actor and critic step of every seed from the world-model update's posterior states (one
        (h, z, weight) per group of its seeds); imagination and the losses run in groups of seeds."""
        c = self.config
        for name in ("actor", "critic"):
            self.optimizers[name].zero_grad()
        rows = []
        try:
            h, z, start_weight = (torch.cat(x) for x in zip(*states))
            for group in self._groups(ACTOR_CRITIC_GROUP):
                self.group = group
                rows += self._actor_critic_losses(h[group], z[group], start_weight[group])
        finally:
            self.group = slice(0, self.S)
        for name in ("actor", "critic"):
            clip_grad_norm_per_seed_(self.nets[name].tensors(), c.ac_grad_clip)
            self.optimizers[name].step()
        with torch.no_grad():
            tau = c.slow_critic_tau
            for t, o in zip(self.nets["slow_critic"].tensors(), self.nets["critic"].tensors()):
                t.copy_(tau * o + (1.0 - tau) * t)
        names = ("actor_loss", "critic_loss", "entropy", "return_scale", "imagined_return")
        return [dict(zip(names, row)) for row in rows]

    def _actor_critic_losses(self, h, z, start_weight) -> list:
        """`DreamerAgent.actor_critic_update` up to the backward pass for the seeds of `self.group`;
        returns their metric rows."""
        c, S, group = self.config, h.shape[0], self.group
        n = h.shape[1]
        if c.imagination_starts < n:
            pick = torch.stack([torch.randperm(n, generator=g)[:c.imagination_starts]
                                for g in self.generators[group]])
            pick = pick.to(h.device)
            h, z = (x.gather(1, pick.unsqueeze(-1).expand(-1, -1, x.shape[-1])) for x in (h, z))
            start_weight = start_weight.gather(1, pick)
        feats, actions, actor_raw = self._imagine(h, z)
        feats = feats.transpose(0, 1).contiguous()                                 # (S, T+1, N, F)
        actions = actions.transpose(0, 1)                                          # (S, T, N)
        M = self._net("model")
        with torch.no_grad():
            rewards = REWARD_GRID.mean(mlp(M, "reward_head.", feats[:, 1:]))     # (S, T, N)
            conts = torch.sigmoid(mlp(M, "cont_head.", feats[:, 1:]).squeeze(-1))
            target_values = VALUE_GRID.mean(mlp(self._net("slow_critic"), "", feats[:, 1:]))
            tm = (rewards.transpose(0, 1), conts.transpose(0, 1), target_values.transpose(0, 1))
            returns = lambda_returns(tm[0], tm[1], torch.cat([tm[2][:1], tm[2]]), c.gamma, c.lambda_)
            discount = torch.cumprod(torch.cat([torch.ones_like(tm[1][:1]), c.gamma * tm[1][:-1]]), 0)
            returns, discount = returns.transpose(0, 1), discount.transpose(0, 1)   # (S, T, N)
            weight = discount * start_weight.unsqueeze(1)
            flat = returns.reshape(S, -1).float().cpu()
            quantiles = torch.quantile(flat, torch.tensor([0.05, 0.95]), dim=1)    # (2, S)
            self.return_range[group] = (c.return_norm_decay * self.return_range[group]
                                        + (1.0 - c.return_norm_decay) * (quantiles[1] - quantiles[0]))
            scale = torch.clamp(self.return_range[group], min=1.0).to(returns.device)
        critic_logits = mlp(self._net("critic"), "", feats[:, :-1])
        values = VALUE_GRID.mean(critic_logits).detach()
        advantages = (returns - values) / scale.reshape(S, 1, 1)
        logits = unimix_logits(actor_raw.transpose(0, 1), c.unimix)                # (S, T, N, A)
        logp = logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        entropy = -(logits.exp() * logits).sum(-1)
        actor_loss = -(weight * (logp * advantages + c.ent_coef * entropy)).reshape(S, -1).mean(1)
        critic_loss = (weight * VALUE_GRID.loss(critic_logits, returns)).reshape(S, -1).mean(1)
        (actor_loss.sum() + critic_loss.sum()).backward()   # disjoint parameters: each net gets its own loss
        with torch.no_grad():
            return torch.stack([actor_loss, critic_loss, entropy.reshape(S, -1).mean(1), scale,
                                returns[:, 0].mean(-1)], 1).tolist()

    # --- one seed's state in and out --------------------------------------------------------------
    def export_seed(self, k: int, agent: DreamerAgent) -> None:
        """Seed k's complete training state into the one-seed agent `agent`."""
        super().export_seed(k, agent)
        agent.normalizer.range = self.return_range[k].clone()
        agent.h = self.h[k].clone()
        agent._pending = None

    def import_seed(self, k: int, agent: DreamerAgent) -> None:
        """The reverse of `export_seed` (resume): the block's counters are the seeds' common ones."""
        super().import_seed(k, agent)
        self.return_range[k] = agent.normalizer.range
        self.h[k] = agent.h
        self._pending = None


def make_block(agents: list, generators: list) -> DreamerBlock:
    """Seeds of one DreamerV3 configuration as one stacked model (the seed-block contract; registry rows `dreamer`
    and `dreamer_large`)."""
    return DreamerBlock(agents, generators)


# a block's seeds agree with one-seed runs to rounding (about 1e-5 after 100 updates), and bit for bit whatever their
# neighbours: a seed's run fingerprint names its block's seeds
make_block.bit_exact_devices = ()
