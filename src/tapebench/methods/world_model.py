"""The world model shared by the DreamerV3-style agent (`dreamer.py`) and PlaNet-style MPC (`planet.py`).

No agent of its own: an RSSM (Hafner et al., 2019; 2023) with

* a deterministic state h (GRU) and a categorical stochastic state z (`stoch_groups` one-hot groups
  of `stoch_classes` classes; straight-through gradients of the samples; 1% uniform mix in every
  categorical, DreamerV3's "unimix");
* an encoder of the observation [tape bits, t/H]; the posterior q(z_t | h_t, e(o_t)) and the prior
  p(z_t | h_t); the transition h_{t+1} = GRU(h_t, [z_t, one-hot(a_t)]) (the action is the one-hot of
  the flipped cell);
* heads on the feature [h, z]: a Bernoulli decoder of the L tape bits, a reward head (symlog two-hot
  over a fixed bin grid) and a continue head (predicts 1 - terminated);
* in the multi-goal protocol (observations [s, g, t/H], docs/protocol.md#multi-goal) the model stays a model of the
  tape: the encoder reads [s, t/H] and the decoder predicts the tape, while the heads that score a state for its
  goal, reward and continue (and DreamerV3's actor and critic), read [h, z, g] with the episode's goal g beside the
  feature (`RSSM.head_input`); with the fixed goal nothing changes (obs [s, t/H], heads on [h, z]);
* the loss: decoder + reward + continue negative log-likelihoods and DreamerV3's balanced KL with free
  bits, `0.5 * max(1, KL[sg(post) || prior]) + 0.1 * max(1, KL[post || sg(prior)])`.

The rule is resampled at every reset and never observed, so the recurrent state is what lets the
model infer it from the episode's transitions: h is reset to zeros at every episode start (per row,
on auto-reset), and the posterior of an episode's first observation is taken from h = 0.

Capacity: the first observation of an episode carries L random bits that the model must pass on
through z (h_1 only sees z_0 and a_0), so z needs at least L bits: the default 32 groups x 4 classes
hold 64 bits (8 x 8 would hold 24, fewer than the 32 bits of an L = 32 tape).

Replay (`SequenceReplay`): one ring per training environment, written in lockstep (one slot per row
per environment step: the transition (o_t, a_t, r_{t+1}, o_{t+1}, terminated, first)); minibatches are
chunks of `sequence_length` consecutive slots of one row. A chunk that starts inside an episode starts
from h = 0 (as DreamerV3 does); episode starts inside a chunk reset the state.

`world_model_rollout` implements the agent contract's prediction interface (agents/__init__.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods.common import adam
from tapebench.methods.contract import split_observation

REWARD_LIMIT = 10.0     # reward bins span [-10, 10] in value space (rewards are in [-1, 1 + bonus])
REWARD_BINS = 41        # evenly spaced in symlog space: spacing 0.12 in symlog units
VALUE_LIMIT = 100.0     # critic bins span [-100, 100] (returns are within [-H, 1 + bonus])
VALUE_BINS = 63


@dataclass
class WorldModelConfig:
    """Hyperparameters of the world model and its training schedule (shared by dreamer and planet)."""

    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    deter_size: int = 128
    """size of the deterministic GRU state h"""
    stoch_groups: int = 32
    """number of categorical latent groups in z (z holds stoch_groups * log2(stoch_classes) bits: at least L)"""
    stoch_classes: int = 4
    """classes per categorical group"""
    hidden_size: int = 128
    """width of the hidden layer of every MLP (encoder, posterior, prior, transition input, heads)"""
    unimix: float = 0.01
    """uniform mixture in every categorical (latents and actor): probs = (1 - unimix) * softmax + unimix / K"""
    free_bits: float = 1.0
    """KL free bits in nats: each KL term (summed over groups) is clipped below at this value"""
    kl_dyn_scale: float = 0.5
    """weight of KL[sg(posterior) || prior] (trains the prior)"""
    kl_rep_scale: float = 0.1
    """weight of KL[posterior || sg(prior)] (trains the representation)"""
    model_lr: float = 6e-4
    """Adam learning rate of the world model"""
    model_grad_clip: float = 100.0
    """gradient-norm clipping threshold of the world model"""
    batch_size: int = 16
    """replayed chunks per world-model update"""
    sequence_length: int = 32
    """slots (environment steps) per replayed chunk"""
    train_ratio: int = 16
    """replayed steps per environment step: one update (batch_size * sequence_length replayed steps)
    every batch_size * sequence_length / train_ratio environment steps"""
    learning_starts: int = 1_024
    """environment steps collected before the first update"""
    buffer_size: int = 100_000
    """replay capacity in environment steps (split evenly over the num_envs rings)"""

    def check(self, name: str = "world model") -> None:
        for field in ("deter_size", "stoch_groups", "hidden_size", "batch_size", "sequence_length",
                      "train_ratio", "buffer_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name} hyperparameter {field} must be >= 1, got {getattr(self, field)}")
        if self.stoch_classes < 2:
            raise ValueError(f"{name} hyperparameter stoch_classes must be >= 2, got {self.stoch_classes}")
        if not 0.0 <= self.unimix < 1.0:
            raise ValueError(f"{name} hyperparameter unimix must be in [0, 1), got {self.unimix}")
        for field in ("free_bits", "kl_dyn_scale", "kl_rep_scale", "learning_starts"):
            if getattr(self, field) < 0:
                raise ValueError(f"{name} hyperparameter {field} must be >= 0, got {getattr(self, field)}")
        if self.model_lr <= 0 or self.model_grad_clip <= 0:
            raise ValueError(f"{name} hyperparameters model_lr and model_grad_clip must be > 0, got "
                             f"{self.model_lr}, {self.model_grad_clip}")
        if self.train_ratio > self.batch_size * self.sequence_length:
            raise ValueError(f"{name} hyperparameter train_ratio must be in 1..batch_size * sequence_length = "
                             f"{self.batch_size * self.sequence_length}, got {self.train_ratio}")
        if self.buffer_size // self.num_envs < self.sequence_length:
            raise ValueError(f"{name} hyperparameter buffer_size must hold at least sequence_length steps per "
                             f"environment (>= {self.sequence_length * self.num_envs}), got {self.buffer_size}")

    @property
    def update_every(self) -> int:
        """Environment steps per world-model update."""
        return max(1, round(self.batch_size * self.sequence_length / self.train_ratio))


# --- symlog two-hot ------------------------------------------------------------------------------
def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot:
    """A fixed grid of bins, evenly spaced in symlog space over [-limit, limit] (value space).

    `encode(x)` puts weight on the two bins around symlog(x) so that their weighted mean is symlog(x)
    (values beyond the grid go to the end bin); `decode(probs)` = symexp(sum_i p_i b_i). So
    decode(encode(x)) = x for every x on the grid's range."""

    def __init__(self, limit: float, bins: int):
        self.bins = torch.linspace(-math.log1p(limit), math.log1p(limit), bins)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        bins = self.bins.to(x.device)
        y = symlog(x).clamp(bins[0], bins[-1])
        upper = torch.searchsorted(bins, y.contiguous(), right=False).clamp(1, len(bins) - 1)
        lower = upper - 1
        width = bins[upper] - bins[lower]
        w_upper = ((y - bins[lower]) / width).clamp(0.0, 1.0)
        target = torch.zeros(*x.shape, len(bins), device=x.device)
        target.scatter_(-1, lower.unsqueeze(-1), (1.0 - w_upper).unsqueeze(-1))
        target.scatter_add_(-1, upper.unsqueeze(-1), w_upper.unsqueeze(-1))
        return target

    def decode(self, probs: torch.Tensor) -> torch.Tensor:
        return symexp((probs * self.bins.to(probs.device)).sum(-1))

    def mean(self, logits: torch.Tensor) -> torch.Tensor:
        return self.decode(torch.softmax(logits, dim=-1))

    def loss(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the two-hot target of x under the logits (elementwise, not reduced)."""
        return -(self.encode(x) * torch.log_softmax(logits, dim=-1)).sum(-1)


REWARD_GRID = TwoHot(REWARD_LIMIT, REWARD_BINS)
VALUE_GRID = TwoHot(VALUE_LIMIT, VALUE_BINS)


# --- categorical latents -------------------------------------------------------------------------
def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, written out: several times faster than torch.softmax on CPU
    for the short last dimensions of the latent groups."""
    e = (logits - logits.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def unimix_logits(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """Log-probabilities of (1 - unimix) * softmax(logits) + unimix / K over the last dimension."""
    if unimix <= 0:
        return torch.log_softmax(logits, dim=-1)
    return torch.log((1.0 - unimix) * softmax(logits) + unimix / logits.shape[-1])


def sample_index(probs: torch.Tensor) -> torch.Tensor:
    """One index per categorical (last dimension) by inversion of the CDF with one uniform from torch's
    global generator each (much faster than torch.multinomial for many small categoricals)."""
    u = torch.rand(probs.shape[:-1] + (1,), device=probs.device)
    return (u > probs.cumsum(-1)).sum(-1).clamp(max=probs.shape[-1] - 1)


def sample_straight_through(logits: torch.Tensor) -> torch.Tensor:
    """A one-hot sample of each categorical with straight-through gradients (logits: log-probabilities)."""
    probs = logits.exp()
    sample = F.one_hot(sample_index(probs.detach()), probs.shape[-1]).to(probs.dtype)
    return sample + probs - probs.detach()


def mode_one_hot(logits: torch.Tensor) -> torch.Tensor:
    return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)


def categorical_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL[p || q] summed over the groups; logits are log-probabilities (..., groups, classes)."""
    return (p_logits.exp() * (p_logits - q_logits)).sum(dim=(-2, -1))


def kl_loss(post_logits, prior_logits, free_bits: float, dyn_scale: float, rep_scale: float):
    """DreamerV3's balanced KL with free bits: (loss per element, KL value per element)."""
    dyn = categorical_kl(post_logits.detach(), prior_logits)
    rep = categorical_kl(post_logits, prior_logits.detach())
    loss = dyn_scale * dyn.clamp(min=free_bits) + rep_scale * rep.clamp(min=free_bits)
    return loss, dyn.detach()


# --- class-major latents (the fused unrolls) ----------------------------------------------------
# Inside the unrolls of `observe_chunk` and imagination a latent is held class-major, (..., classes,
# groups), so that the softmax, cumulative sum and one-hot over the few classes run along a
# non-innermost dimension, vectorised over the groups (over the innermost dimension of 4 classes
# they are several times slower on CPU). The parameters keep their group-major meaning: the unrolls
# use row- and column-permuted views of the weights (`UnrollWeights`), so checkpoints are unchanged.
def class_major_probs(raw: torch.Tensor, classes: int, unimix: float) -> torch.Tensor:
    """(1 - unimix) * softmax + unimix / K of class-major raw logits (..., K * G) -> (..., K, G)."""
    probs = torch.softmax(raw.reshape(*raw.shape[:-1], classes, -1), dim=-2)
    return probs if unimix <= 0 else probs * (1.0 - unimix) + unimix / classes


def class_major_logprobs(raw: torch.Tensor, classes: int, unimix: float) -> torch.Tensor:
    """Log-probabilities of `class_major_probs` (..., K, G)."""
    if unimix <= 0:
        return torch.log_softmax(raw.reshape(*raw.shape[:-1], classes, -1), dim=-2)
    return torch.log(class_major_probs(raw, classes, unimix))


def class_major_sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One-hot samples (N, K, G) of class-major probabilities (N, K, G) by inversion of the CDF with
    the given uniforms (N, 1, G); the last class takes what rounding leaves above the CDF."""
    index = (uniform > probs[:, :-1].cumsum(1)).sum(1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, index, 1.0)


def to_group_major(z: torch.Tensor, groups: int, classes: int) -> torch.Tensor:
    """Flat class-major latents (..., K * G) -> flat group-major (..., G * K) (a copy)."""
    return z.reshape(*z.shape[:-1], classes, groups).transpose(-1, -2).reshape(*z.shape[:-1], groups * classes)


def to_class_major(z: torch.Tensor, groups: int, classes: int) -> torch.Tensor:
    """Flat group-major latents (..., G * K) -> flat class-major (..., K * G) (a copy)."""
    return z.reshape(*z.shape[:-1], groups, classes).transpose(-1, -2).reshape(*z.shape[:-1], groups * classes)


# --- networks ------------------------------------------------------------------------------------
def mlp(in_dim: int, out_dim: int, hidden: int, zero_out: bool = False) -> nn.Sequential:
    """Linear -> LayerNorm -> SiLU -> Linear (DreamerV3's block, one hidden layer)."""
    out = nn.Linear(hidden, out_dim)
    if zero_out:   # DreamerV3 zero-initialises the reward and critic outputs
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.SiLU(), out)


def _ln_silu(x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
    return F.silu(F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps))


@dataclass
class UnrollWeights:
    """`RSSM.unroll_weights()`: the weights of one fused unroll (class-major latent rows / columns)."""

    img_z: torch.Tensor
    img_a: torch.Tensor
    img_b: torch.Tensor
    img_ln: nn.LayerNorm
    post_h: torch.Tensor
    post_e: torch.Tensor
    post_b: torch.Tensor
    post_ln: nn.LayerNorm
    post_out: torch.Tensor
    post_out_b: torch.Tensor
    prior_in: torch.Tensor
    prior_in_b: torch.Tensor
    prior_ln: nn.LayerNorm
    prior_out: torch.Tensor
    prior_out_b: torch.Tensor


class RSSM(nn.Module):
    """Recurrent state-space model with categorical latents, and its heads."""

    def __init__(self, config: WorldModelConfig, env_spec):
        super().__init__()
        c = config
        self.L, self.num_actions = env_spec.L, env_spec.num_actions
        self.groups, self.classes, self.unimix = c.stoch_groups, c.stoch_classes, c.unimix
        self.deter_size, self.stoch_size = c.deter_size, c.stoch_groups * c.stoch_classes
        self.feat_size = self.deter_size + self.stoch_size
        # the multi-goal protocol: the goal's L cells go beside [h, z] into the scoring heads, not into the encoder
        self.goal_size = env_spec.L if env_spec.goal_in_obs else 0
        self.head_size = self.feat_size + self.goal_size
        self.encoder = mlp(env_spec.obs_dim - self.goal_size, c.hidden_size, c.hidden_size)
        self.img_in = nn.Sequential(nn.Linear(self.stoch_size + self.num_actions, c.hidden_size),
                                    nn.LayerNorm(c.hidden_size), nn.SiLU())
        self.gru = nn.GRUCell(c.hidden_size, c.deter_size)
        self.prior_net = mlp(c.deter_size, self.stoch_size, c.hidden_size)
        self.post_net = mlp(c.deter_size + c.hidden_size, self.stoch_size, c.hidden_size)
        self.decoder = mlp(self.feat_size, env_spec.L, c.hidden_size)
        self.reward_head = mlp(self.head_size, REWARD_BINS, c.hidden_size, zero_out=True)
        self.cont_head = mlp(self.head_size, 1, c.hidden_size)
        # class-major position k * G + g -> group-major index g * K + k (not a parameter, not saved)
        order = torch.arange(self.stoch_size).reshape(self.groups, self.classes).t().reshape(-1)
        self.register_buffer("class_major_order", order, persistent=False)

    # latents: (..., groups, classes) log-probabilities with unimix
    def _latent(self, raw: torch.Tensor) -> torch.Tensor:
        return unimix_logits(raw.reshape(*raw.shape[:-1], self.groups, self.classes), self.unimix)

    def initial(self, n: int, device) -> torch.Tensor:
        return torch.zeros(n, self.deter_size, device=device)

    def prior(self, h: torch.Tensor) -> torch.Tensor:
        return self._latent(self.prior_net(h))

    def posterior(self, h: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        return self._latent(self.post_net(torch.cat([h, embed], dim=-1)))

    def transition(self, h: torch.Tensor, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """h_{t+1} = GRU(h_t, [z_t, one-hot(a_t)]); z flat (N, stoch_size), actions (N,) long."""
        onehot = F.one_hot(actions, self.num_actions).to(h.dtype)
        return self.gru(self.img_in(torch.cat([z, onehot], dim=-1)), h)

    @staticmethod
    def flat(z: torch.Tensor) -> torch.Tensor:
        return z.reshape(*z.shape[:-2], -1)

    def features(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.cat([h, z], dim=-1)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder's embedding of an observation's tape and t/H; the goal of an [s, g, t/H] observation is left
        out (the model predicts tapes; the goal reaches the scoring heads through `head_input`)."""
        tape, goal, time = split_observation(obs, self.L)
        return self.encoder(obs if goal is None else torch.cat([tape, time], dim=-1))

    def goal_of(self, obs: torch.Tensor) -> torch.Tensor | None:
        """The goal of each observation (..., L) in the multi-goal protocol; None with the fixed goal."""
        return split_observation(obs, self.L)[1] if self.goal_size else None

    def head_input(self, feat: torch.Tensor, goal: torch.Tensor | None) -> torch.Tensor:
        """What the scoring heads read: [h, z] and, in the multi-goal protocol, the episode's goal beside it
        (`goal` (..., L), broadcast over the leading dimensions of `feat`, e.g. an imagined trajectory's steps)."""
        if not self.goal_size:
            return feat
        if goal is None:
            raise ValueError("this world model was trained on derived goals ([s, g, t/H] observations): its reward "
                             "and continue heads need each state's goal")
        return torch.cat([feat, goal.expand(*feat.shape[:-1], self.goal_size)], dim=-1)

    # --- the fused unroll (observe_chunk, imagination): class-major latents ----------------------
    def unroll_weights(self) -> "UnrollWeights":
        """The weights the fused unrolls use, taken once per unroll (differentiable views: the
        gradients reach the parameters): the latent rows of the prior and posterior output layers and
        the latent columns of the transition's input layer permuted to the class-major order, and the
        input layers split into their parts (latent, action; h, embedding)."""
        S, D, order = self.stoch_size, self.deter_size, self.class_major_order
        img, post, prior = self.img_in[0], self.post_net, self.prior_net
        return UnrollWeights(
            img_z=img.weight[:, :S][:, order], img_a=img.weight[:, S:], img_b=img.bias, img_ln=self.img_in[1],
            post_h=post[0].weight[:, :D], post_e=post[0].weight[:, D:], post_b=post[0].bias, post_ln=post[1],
            post_out=post[3].weight[order], post_out_b=post[3].bias[order],
            prior_in=prior[0].weight, prior_in_b=prior[0].bias, prior_ln=prior[1],
            prior_out=prior[3].weight[order], prior_out_b=prior[3].bias[order])

    def action_inputs(self, w: "UnrollWeights", actions: torch.Tensor) -> torch.Tensor:
        """The action's part of the transition's input layer, bias included, for every action (..., H)."""
        return F.linear(F.one_hot(actions, self.num_actions).to(w.img_z.dtype), w.img_a, w.img_b)

    def img_step(self, w: "UnrollWeights", h: torch.Tensor, z: torch.Tensor, action_in: torch.Tensor) -> torch.Tensor:
        """`transition` with class-major z (N, K * G) and the action's precomputed input `action_in`."""
        x = _ln_silu(torch.addmm(action_in, z, w.img_z.t()), w.img_ln)
        return self.gru(x, h)

    def prior_raw(self, w: "UnrollWeights", h: torch.Tensor) -> torch.Tensor:
        """Class-major raw prior logits (..., K * G) of h."""
        return F.linear(_ln_silu(F.linear(h, w.prior_in, w.prior_in_b), w.prior_ln), w.prior_out, w.prior_out_b)

    def reward(self, feat: torch.Tensor, goal: torch.Tensor | None = None) -> torch.Tensor:
        return REWARD_GRID.mean(self.reward_head(self.head_input(feat, goal)))

    def cont(self, feat: torch.Tensor, goal: torch.Tensor | None = None) -> torch.Tensor:
        return torch.sigmoid(self.cont_head(self.head_input(feat, goal)).squeeze(-1))


# --- sequence replay -----------------------------------------------------------------------------
class SequenceReplay:
    """One ring of `capacity` slots per training environment, written in lockstep; samples chunks.

    Slot t of a ring: obs (o_t), action (a_t), reward (r_{t+1}), next_obs (o_{t+1}, the true successor),
    terminated, first (o_t is an episode's first observation)."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "first")

    def __init__(self, num_rows: int, capacity: int, obs_dim: int, device):
        self.rows, self.capacity, self.device = num_rows, capacity, device
        self.obs = torch.zeros(num_rows, capacity, obs_dim, device=device)
        self.next_obs = torch.zeros(num_rows, capacity, obs_dim, device=device)
        self.actions = torch.zeros(num_rows, capacity, dtype=torch.long, device=device)
        self.rewards = torch.zeros(num_rows, capacity, device=device)
        self.terminated = torch.zeros(num_rows, capacity, dtype=torch.bool, device=device)
        self.first = torch.zeros(num_rows, capacity, dtype=torch.bool, device=device)
        self.row_first = torch.ones(num_rows, dtype=torch.bool, device=device)  # next slot starts an episode
        self.position = 0
        self.size = 0

    def add(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        p = self.position
        self.obs[:, p], self.next_obs[:, p], self.actions[:, p] = obs, next_obs, actions
        self.rewards[:, p], self.terminated[:, p], self.first[:, p] = rewards, terminated, self.row_first
        self.row_first = (terminated | truncated).to(self.device)
        self.position = (p + 1) % self.capacity
        self.size = min(self.capacity, self.size + 1)

    def sample(self, batch_size: int, length: int) -> dict:
        """`batch_size` chunks of `length` consecutive slots (global torch generator): (B, T, ...) tensors."""
        rows = torch.randint(0, self.rows, (batch_size,))
        starts = torch.randint(0, self.size - length + 1, (batch_size,))
        oldest = (self.position - self.size) % self.capacity
        slots = (oldest + starts.unsqueeze(1) + torch.arange(length)) % self.capacity
        rows, slots = rows.unsqueeze(1).to(self.device), slots.to(self.device)
        return {name: getattr(self, name)[rows, slots] for name in self.FIELDS}

    def state_dict(self) -> dict:
        # chronological order of the filled part only (the rest is still zero)
        order = (self.position - self.size + torch.arange(self.size)) % self.capacity
        state = {name: getattr(self, name)[:, order].cpu().clone() for name in self.FIELDS}
        return {**state, "row_first": self.row_first.cpu().clone(), "size": self.size, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        n = state["size"]
        if n > self.capacity:
            raise ValueError(f"replay state holds {n} steps per environment but the rings hold {self.capacity}")
        order = (state["position"] - n + torch.arange(n)) % self.capacity
        for name in self.FIELDS:
            getattr(self, name)[:, order] = state[name].to(self.device)
        self.row_first = state["row_first"].to(self.device).clone()
        self.position, self.size = state["position"], n


# --- training the model on replayed chunks -------------------------------------------------------
def observe_chunk(model: RSSM, chunk: dict, config: WorldModelConfig):
    """Filter the posterior through a replayed chunk (sampled latents); returns (loss, metrics, states).

    `metrics` holds 0-d tensors (detached; convert them once per update). `states` = (h, z, weight[, goal])
    of every transition's posterior state (B*T rows, detached; z flat group-major), with weight
    1 - terminated, the starting points of imagination; in the multi-goal protocol also each state's goal.

    The unroll does per step only what depends on the previous step: the transition and the
    posterior's MLP from h (class-major latents, see `class_major_probs`); the embedding's and the
    action's parts of the input layers, the uniforms of the samples, the priors, the log-probabilities
    and every head are computed for the whole chunk at once."""
    obs, next_obs, actions = chunk["obs"], chunk["next_obs"], chunk["actions"]
    B, T = actions.shape
    G, K = model.groups, model.classes
    w = model.unroll_weights()
    # per step inputs, time-major: the embedding's part of the posterior's input layer, the action's
    # part of the transition's input layer, the uniforms of the posterior samples
    post_in = F.linear(model.encode(next_obs.transpose(0, 1)), w.post_e, w.post_b)       # (T, B, H)
    action_in = model.action_inputs(w, actions.t())                                        # (T, B, H)
    uniform = torch.rand(T, B, 1, G, device=obs.device)
    # where a chunk or an episode starts: the posterior of o_t from h = 0 (only at those slots)
    starts = chunk["first"].clone()
    starts[:, 0] = True
    start_obs = obs[starts]                       # (S, obs_dim), in row-major order of (b, t)
    h0 = model.initial(len(start_obs), obs.device)
    start_post = model.posterior(h0, model.encode(start_obs))
    start_z = model.flat(sample_straight_through(start_post))
    slot = (starts.reshape(-1).long().cumsum(0) - 1).reshape(B, T)   # index into the S start slots
    start_z_t = to_class_major(start_z, G, K)[slot.t()]                # (T, B, K*G)
    starts_t = starts.t().unsqueeze(-1)                                # (T, B, 1)
    restarts = starts.any(0).tolist()                                  # one host read per chunk
    # per-step slices by unbind: its backward is one stack (indexing [t] would scatter every step's
    # gradient into a zero tensor of the whole chunk)
    post_in, action_in, start_z_t = post_in.unbind(0), action_in.unbind(0), start_z_t.unbind(0)
    # the per-step weights transposed once, contiguous (products with few rows run faster on them)
    z_weight, h_weight, out_weight = (m.t().contiguous() for m in (w.img_z, w.post_h, w.post_out))
    hs, raws, zs = [], [], []
    h, z = model.initial(B, obs.device), start_z_t[0]
    for t in range(T):
        if t > 0 and restarts[t]:
            h = h.masked_fill(starts_t[t], 0.0)
            z = torch.where(starts_t[t], start_z_t[t], z)
        h = model.gru(_ln_silu(torch.addmm(action_in[t], z, z_weight), w.img_ln), h)
        raw = torch.addmm(w.post_out_b, _ln_silu(torch.addmm(post_in[t], h, h_weight), w.post_ln), out_weight)
        probs = class_major_probs(raw, K, model.unimix)                 # (B, K, G)
        sample = class_major_sample(probs.detach(), uniform[t])
        z = (sample + (probs - probs.detach())).reshape(B, K * G)      # straight-through gradients
        hs.append(h)
        raws.append(raw)
        zs.append(z)
    h, z = torch.stack(hs, 1), to_group_major(torch.stack(zs, 1), G, K)  # (B, T, ...), z group-major
    post = class_major_logprobs(torch.stack(raws, 1), K, model.unimix)   # (B, T, K, G)
    prior = class_major_logprobs(model.prior_raw(w, h), K, model.unimix)
    feat = model.features(h, z)
    tape = next_obs[..., :model.L]
    decoder_logits = model.decoder(feat)
    decoder_nll = F.binary_cross_entropy_with_logits(decoder_logits, tape, reduction="none").sum(-1)
    goal = model.goal_of(next_obs)       # (B, T, L): the episode's goal at each step (None: the fixed goal)
    head_in = model.head_input(feat, goal)
    reward_nll = REWARD_GRID.loss(model.reward_head(head_in), chunk["rewards"])
    cont_nll = F.binary_cross_entropy_with_logits(model.cont_head(head_in).squeeze(-1),
                                                  1.0 - chunk["terminated"].float(), reduction="none")
    kl, kl_value = kl_loss(post, prior, config.free_bits, config.kl_dyn_scale, config.kl_rep_scale)
    # the first observation of a chunk or episode: decoder and KL against the prior of h = 0
    start_nll = F.binary_cross_entropy_with_logits(model.decoder(model.features(h0, start_z)), start_obs[:, :model.L],
                                                   reduction="none").sum(-1)
    start_kl, _ = kl_loss(start_post, model.prior(h0), config.free_bits, config.kl_dyn_scale, config.kl_rep_scale)
    start_loss = (start_nll + start_kl).sum() / (B * T)
    loss = (decoder_nll + reward_nll + cont_nll + kl).mean() + start_loss
    with torch.no_grad():
        wrong = ((decoder_logits > 0).float() != tape).float().mean()
        metrics = {"model_loss": loss.detach(), "decoder_nll": decoder_nll.mean(), "reward_nll": reward_nll.mean(),
                   "kl": kl_value.mean(), "cell_error": wrong}
    weight = 1.0 - chunk["terminated"].float()
    states = (h.detach().reshape(B * T, -1), z.detach().reshape(B * T, -1), weight.reshape(B * T))
    if goal is not None:   # each start state's goal, for the imagined rewards of the multi-goal protocol
        states = states + (goal.reshape(B * T, -1),)
    return loss, metrics, states


def metric_values(metrics: dict) -> dict:
    """0-d metric tensors -> floats, with one host read."""
    values = torch.stack([v.detach().float() for v in metrics.values()]).tolist()
    return dict(zip(metrics, values))


# --- filtering and the prediction contract -------------------------------------------------------
@torch.no_grad()
def filter_mode(model: RSSM, h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """The posterior mode of z given h and the observation (flat one-hot)."""
    return model.flat(mode_one_hot(model.posterior(h, model.encode(obs))))


@torch.no_grad()
def world_model_rollout(model: RSSM, obs_prefix: torch.Tensor, action_prefix: torch.Tensor,
                        actions: torch.Tensor, repeat: int = 1) -> torch.Tensor:
    """The agent contract's `world_model_rollout`: (N * repeat, D, L) probabilities that each cell is 1 after
    each of the D `actions`, filtered through the prefix with posterior modes, then open loop with
    prior modes; each prefix's state serves `repeat` consecutive rows of `actions`. Deterministic: no random
    draws, no state change."""
    obs_prefix = torch.as_tensor(obs_prefix, dtype=torch.float32)
    action_prefix, actions = torch.as_tensor(action_prefix).long(), torch.as_tensor(actions).long()
    N, C1, _ = obs_prefix.shape
    if action_prefix.shape != (N, C1 - 1) or actions.dim() != 2 or actions.shape[0] != N * repeat:
        raise ValueError(f"world_model_rollout: obs_prefix (N, C+1, obs_dim), action_prefix (N, C) and actions "
                         f"(N x repeat, D) must agree, got {tuple(obs_prefix.shape)}, {tuple(action_prefix.shape)}, "
                         f"{tuple(actions.shape)} with repeat {repeat}")
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        obs_prefix, action_prefix, actions = obs_prefix.to(device), action_prefix.to(device), actions.to(device)
        h = model.initial(N, device)
        z = filter_mode(model, h, obs_prefix[:, 0])
        for j in range(C1 - 1):
            h = model.transition(h, z, action_prefix[:, j])
            z = filter_mode(model, h, obs_prefix[:, j + 1])
        if repeat != 1:
            h, z = h.repeat_interleave(repeat, 0), z.repeat_interleave(repeat, 0)
        probs = []
        for d in range(actions.shape[1]):
            h = model.transition(h, z, actions[:, d])
            z = model.flat(mode_one_hot(model.prior(h)))
            probs.append(torch.sigmoid(model.decoder(model.features(h, z))))
        return torch.stack(probs, 1) if probs else torch.zeros(N * repeat, 0, model.L, device=device)
    finally:
        model.train(was_training)


class WorldModelLearner:
    """The world model, its optimiser, the sequence replay and the update schedule, as one piece that
    both agents hold: `add` each batched transition, `due()` tells whether an update is due,
    `update()` takes one gradient step and returns the posterior states of the chunk."""

    def __init__(self, config: WorldModelConfig, env_spec, device):
        self.config, self.device = config, torch.device(device)
        self.model = RSSM(config, env_spec).to(self.device)
        self.optimizer = adam(self.model.parameters(), lr=config.model_lr)
        self.replay = SequenceReplay(config.num_envs, max(config.sequence_length, config.buffer_size // config.num_envs),
                                     env_spec.obs_dim, self.device)
        self.env_steps = 0
        self.next_update = max(config.learning_starts, config.sequence_length * config.num_envs)
        self.updates = 0

    def add(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.replay.add(obs, actions, rewards, next_obs, terminated, truncated)
        self.env_steps += len(actions)

    def due(self) -> int:
        """Updates due after the latest environment steps (advances the schedule)."""
        n = 0
        while self.env_steps >= self.next_update:
            self.next_update += self.config.update_every
            n += 1
        return n

    def update(self):
        c = self.config
        chunk = self.replay.sample(c.batch_size, c.sequence_length)
        loss, metrics, states = observe_chunk(self.model, chunk, c)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), c.model_grad_clip)
        self.optimizer.step()
        self.updates += 1
        return metric_values(metrics), states

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "replay": self.replay.state_dict(), "env_steps": self.env_steps, "next_update": self.next_update,
                "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.env_steps, self.next_update, self.updates = state["env_steps"], state["next_update"], state["updates"]
