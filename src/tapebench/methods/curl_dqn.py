"""CURL-DQN: DQN with a contrastive auxiliary loss (Laskin, Srinivas & Abbeel, 2020, "CURL", on DQN).

Networks. The Q-network is DQN's MLP (`dqn.py`), read as a *query encoder* (its hidden layers,
observation -> `hidden_size` ReLU features) followed by a linear Q head. A *key encoder* of the same
shape starts as a copy of the query encoder and is only ever updated as an exponential moving average
of it (`key <- m * key + (1 - m) * query` after every gradient step, m = `key_momentum`); it gets no
gradients. A learned matrix W scores query/key pairs bilinearly: `logits[i, j] = q_i^T W k_j`.
The target network is a periodic copy of the whole Q-network (query encoder + Q head), as in DQN.

Loss per gradient step, on one replay minibatch of observations o_1..o_B:
  TD loss (DQN's Huber loss) on the RAD-augmented minibatch (`augment_td`; as CURL, which trains the RL
  loss on augmented observations: random circular shift of obs, next_obs and action, a 2-D translation of the
  torus on the grid family, bit flips of obs)
  + `curl_weight` x InfoNCE between two independent augmentations of each o_i: the anchor, encoded by the
  query encoder, is the TD loss's own augmented observation (one forward pass serves both losses, as in
  CURL); the positive is a second, independent random shift + bit flips of o_i, encoded by the key
  encoder; the other B - 1 positives of the minibatch are the negatives:
  `InfoNCE = mean_i [ -logits[i, i] + log sum_j exp(logits[i, j]) ]`.
  With `augment_td = False` the TD loss sees the raw minibatch and the anchor is its own augmentation.

Evaluation is the greedy policy argmax_a Q(o, a) on the raw observation (no augmentation, no state).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import augment, dqn
from tapebench.methods.common import adam


@dataclass
class Config(dqn.Config):
    curl_weight: float = 1.0
    """λ: weight of the InfoNCE loss added to the TD loss (CURL adds the two unweighted)"""
    key_momentum: float = 0.99
    """m: after each gradient step the key encoder becomes m * key + (1 - m) * query"""
    shift: bool = True
    """augmentations use a random circular shift of the tape (for the TD batch also of next_obs and action)"""
    flip_prob: float = 0.05
    """probability that each tape cell of an augmented observation is flipped; 0 switches it off"""
    augment_td: bool = True
    """TD loss on the RAD-augmented minibatch, whose observation is also the anchor (as CURL); False: raw minibatch"""

    def check(self) -> None:
        super().check()
        if self.network != "mlp":   # the encoder / Q-head split and W are built on the MLP's hidden layers
            raise ValueError(f"CURL-DQN hyperparameter network must be 'mlp' (its query encoder is the MLP's "
                             f"hidden layers), got {self.network!r}")
        if self.curl_weight < 0:
            raise ValueError(f"CURL-DQN hyperparameter curl_weight must be >= 0, got {self.curl_weight}")
        if not 0.0 <= self.key_momentum <= 1.0:
            raise ValueError(f"CURL-DQN hyperparameter key_momentum must be in [0, 1], got {self.key_momentum}")
        if not 0.0 <= self.flip_prob < 0.5:
            raise ValueError(f"CURL-DQN hyperparameter flip_prob must be in [0, 0.5), got {self.flip_prob}")


def info_nce(query: torch.Tensor, key: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Bilinear InfoNCE: row i's positive is key i, the other keys of the batch are its negatives."""
    logits = query @ W @ key.T
    return F.cross_entropy(logits, torch.arange(len(query), device=query.device))


class CURLDQNAgent(dqn.DQNAgent):
    """DQN (acting, replay, target network, checkpoint of the policy) plus the contrastive auxiliary loss."""

    def __init__(self, config: Config, env_spec, total_steps: int, device):
        super().__init__(config, env_spec, total_steps, device)
        self.L, self.grid = env_spec.L, env_spec.grid
        self.query_encoder = self.q_network[:-1]     # shares its layers with the Q-network
        self.key_encoder = copy.deepcopy(self.query_encoder).requires_grad_(False)
        # zero: the untrained similarity is uniform (InfoNCE = log B) instead of saturated
        self.W = nn.Parameter(torch.zeros(config.hidden_size, config.hidden_size, device=self.device))
        self.optimizer = adam([*self.q_network.parameters(), self.W], lr=config.learning_rate)

    def contrastive_loss(self, anchor_features: torch.Tensor, positive_obs: torch.Tensor) -> torch.Tensor:
        """InfoNCE of the anchors' query features against the key encoder's features of the positives."""
        with torch.no_grad():
            keys = self.key_encoder(positive_obs)
        return info_nce(anchor_features, keys, self.W)

    def _gradient_step(self) -> dict:
        c = self.config
        batch = self.replay.sample(c.batch_size)
        view = lambda: augment.augment_observations(batch[0], self.L, c.shift, c.flip_prob, self.grid)
        if c.augment_td:   # as in CURL, the anchor is the RL loss's own augmented observation
            td_batch = augment.augment_transitions(*batch, L=self.L, shift=c.shift, flip_prob=c.flip_prob,
                                                   grid=self.grid)
            anchor_features = self.query_encoder(td_batch[0])
            q_values = self.q_network[-1](anchor_features)
        else:
            td_batch, q_values = batch, None
            anchor_features = self.query_encoder(view())
        td_loss, q_taken = self.td_loss(*td_batch, q_values=q_values)
        curl_loss = self.contrastive_loss(anchor_features, view())
        loss = td_loss + c.curl_weight * curl_loss
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_([*self.q_network.parameters(), self.W], c.max_grad_norm)
        self.optimizer.step()
        self._update_key_encoder()
        self.gradient_steps += 1
        return {"td_loss": td_loss.item(), "curl_loss": curl_loss.item(), "q_mean": q_taken.mean().item()}

    @torch.no_grad()
    def _update_key_encoder(self) -> None:
        m = self.config.key_momentum
        for key, query in zip(self.key_encoder.parameters(), self.query_encoder.parameters()):
            key.mul_(m).add_(query, alpha=1.0 - m)

    # --- checkpointing (the policy is the Q-network alone, as in DQN) --------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "key_encoder": self.key_encoder.state_dict(), "W": self.W.detach().clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.key_encoder.load_state_dict(state["key_encoder"])
        with torch.no_grad():
            self.W.copy_(state["W"])


def make(config: Config, env_spec, total_steps: int, device) -> CURLDQNAgent:
    return CURLDQNAgent(config, env_spec, total_steps, device)
