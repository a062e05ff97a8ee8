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

A seed block (`make_block`, methods/contract.py "Seed blocks") is DQN's block plus each seed's stacked key encoder and
W; the augmentations draw from each seed's own generator in the one-seed order, InfoNCE is each seed's own.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods import augment, dqn, stacked
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


def info_nce_per_seed(query: torch.Tensor, key: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Each seed's `info_nce`: query, key (S, B, h), W (S, h, h) -> (S,). On a CPU seed by seed, the one-seed
    products bit for bit; elsewhere as batched products."""
    if query.device.type == "cpu":
        return torch.stack([info_nce(q, k, w) for q, k, w in zip(query.unbind(0), key.unbind(0), W.unbind(0))])
    logits = query @ W @ key.transpose(1, 2)
    S, B = logits.shape[:2]
    labels = torch.arange(B, device=query.device).repeat(S)
    return F.cross_entropy(logits.flatten(0, 1), labels, reduction="none").view(S, B).mean(dim=1)


def stacked_encoder(parameters: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """S encoders (the MLP's hidden layers, each Linear then ReLU) as one: x (S, B, in) -> features (S, B, h)."""
    for weight, bias in zip(parameters[0::2], parameters[1::2]):
        x = torch.relu(stacked.stacked_linear(x, weight, bias))
    return x


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


class CURLDQNBlock(dqn.DQNBlock):
    """S seeds of CURL-DQN as one seed block (methods/contract.py, "Seed blocks"): DQN's block (stacked Q- and target
    networks, replay, SeedAdam) plus each seed's key encoder and W stacked. Seed k's augmentations draw from
    `generators[k]` after its replay indices, in its one-seed order; its loss is its own TD loss plus its own
    InfoNCE, its gradient clip covers its Q-network and W, its key encoder follows its own query encoder."""

    agent_type = CURLDQNAgent

    def stack_extras(self, agents: list[CURLDQNAgent]) -> list[torch.Tensor]:
        self.L, self.grid = agents[0].L, agents[0].grid
        self.key_parameters = stacked.stack_parameters([a.key_encoder for a in agents], requires_grad=False)
        self.W = torch.stack([a.W.detach() for a in agents]).clone().requires_grad_(True)
        return [self.W]

    @staticmethod
    def agent_trained_parameters(agent: CURLDQNAgent) -> list[torch.Tensor]:
        return [*agent.q_network.parameters(), agent.W]

    def _gradient_step(self) -> list[dict]:
        c = self.config
        batch = self.sample_batch()
        # seed k's draws in its one-seed order: the TD batch's view (or the anchors'), then the positives'
        first, positive = augment.seed_views(2, c.batch_size, self.L, c.shift, c.flip_prob, self.device,
                                             self.generators)
        query_parameters = self.q_parameters[:-2]
        if c.augment_td:
            td_batch = augment.in_rows(lambda *rows: first.transitions(*rows, self.L, self.grid), *batch)
            anchor_features = stacked_encoder(query_parameters, td_batch[0])
            q_values = stacked.stacked_linear(anchor_features, *self.q_parameters[-2:])
        else:
            td_batch, q_values = batch, None
            anchor_features = stacked_encoder(query_parameters, augment.in_rows(
                lambda rows: first.observations(rows, self.L, self.grid), batch[0]))
        td_losses, q_taken = self.td_losses(*td_batch, q_values=q_values)
        with torch.no_grad():
            keys = stacked_encoder(self.key_parameters, augment.in_rows(
                lambda rows: positive.observations(rows, self.L, self.grid), batch[0]))
        curl_losses = info_nce_per_seed(anchor_features, keys, self.W)
        self.step_optimizer(td_losses + c.curl_weight * curl_losses)
        self._update_key_encoder()
        td_loss, curl_loss, q_mean = td_losses.tolist(), curl_losses.tolist(), q_taken.detach().mean(dim=1).tolist()
        return [{"td_loss": td, "curl_loss": curl, "q_mean": q} for td, curl, q in zip(td_loss, curl_loss, q_mean)]

    @torch.no_grad()
    def _update_key_encoder(self) -> None:
        """key <- m * key + (1 - m) * query on each seed's slices, the one-seed operations tensor by tensor."""
        m, S = self.config.key_momentum, self.num_seeds
        keys = [key[k] for k in range(S) for key in self.key_parameters]
        queries = [query[k] for k in range(S) for query in self.q_parameters[:len(self.key_parameters)]]
        torch._foreach_mul_(keys, m)
        torch._foreach_add_(keys, queries, alpha=1.0 - m)

    def export_seed(self, k: int, agent: CURLDQNAgent) -> None:
        super().export_seed(k, agent)
        stacked.write_parameters(self.key_parameters, k, agent.key_encoder)
        with torch.no_grad():
            agent.W.copy_(self.W[k])

    def import_seed(self, k: int, agent: CURLDQNAgent) -> None:
        super().import_seed(k, agent)
        stacked.read_parameters(self.key_parameters, k, agent.key_encoder)
        with torch.no_grad():
            self.W[k].copy_(agent.W)


def make_block(agents: list[CURLDQNAgent], generators: list[torch.Generator]) -> CURLDQNBlock:
    """S CURL-DQN agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return CURLDQNBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
