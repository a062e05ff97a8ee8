"""PlaNet-style latent MPC (Hafner et al., 2019): the world model of `world_model.py`, planned with a
categorical cross-entropy method (CEM) in latent space. No actor, no critic.

Training: the world model (RSSM, tape decoder, reward and continue heads; same code and losses as the
DreamerV3-style agent) on a sequence replay collected with **uniformly random actions**. PlaNet
collects with its planner in the loop; here a plan per environment step would cost more than the
whole model training (see the evaluation cost below), and random flips cover the dynamics of every
training rule evenly, so the model is trained on random-action data and the planner is only used to
act at evaluation. (A consequence to keep in mind: states near the goal are visited only as often as
random flips reach them.)

Evaluation (`evaluation_policy()`): per row, the posterior (mode) is filtered through the episode's
transitions from h = 0 at `begin`. At each decision, CEM over action sequences of length
`plan_horizon`: `iterations` rounds of `candidates` sequences drawn from per-depth categoricals over
the L cells (uniform in the first round); each is rolled out open loop with the prior's mode and scored
by the predicted sum of rewards, each weighted by the product of the predicted continue probabilities
before it (reaching the goal ends the sum) and cut at the episode's remaining steps; the categoricals
are refitted to the frequencies of the `elites` best sequences (mixed with `plan_mix` of uniform);
the first action of the best sequence seen is executed, and the planner replans at the next step.
In the multi-goal protocol the reward and continue heads read each episode's goal beside the latent state
(`world_model.py`), so a plan is scored for the episode's own goal.
Candidate draws are a pure function of the episode key (`batch.keys`), the step and the round
(counter-based hashing, `evaluation.policy.step_keys`), so they do not depend on batching and never
touch the global torch generator.

Cost: one decision rolls `iterations * candidates * plan_horizon` latent steps (defaults 2 x 32 x 5 =
320). Faithful PlaNet uses 10 iterations of 1000 candidates over horizon 12 (120,000 latent steps per
decision); one evaluation of the paper protocol (~5,120 episodes x 32 steps) would then take days on a
CPU, so the defaults are the affordable budget measured in docs/methods/planet.md.

A seed block (`make_block`) trains S seeds' world models as one stacked model (`world_model_block.py`), each seed's
random actions drawn from its own generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tapebench.episodes.streams import step_keys
from tapebench.methods.world_model import (RSSM, WorldModelConfig, WorldModelLearner, filter_mode, mode_one_hot,
                                           world_model_rollout)
from tapebench.methods.world_model_block import WorldModelBlock

PLAN_SALT = 0x504C414E45       # the planner's stream of per-episode random words
PLAN_ROWS = 64                 # episodes planned together (memory bound; results do not depend on it)


@dataclass
class Config(WorldModelConfig):
    plan_horizon: int = 5
    """length of the planned action sequences"""
    candidates: int = 32
    """action sequences per CEM round"""
    iterations: int = 2
    """CEM rounds per decision"""
    elites: int = 4
    """best sequences the per-depth categoricals are refitted to"""
    plan_mix: float = 0.1
    """uniform share mixed into the refitted categoricals (keeps every cell possible)"""

    def check(self) -> None:
        super().check("PlaNet-MPC")
        for name in ("plan_horizon", "candidates", "iterations", "elites"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlaNet-MPC hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        if self.elites > self.candidates:
            raise ValueError(f"PlaNet-MPC hyperparameter elites must be in 1..candidates = {self.candidates}, "
                             f"got {self.elites}")
        if not 0.0 <= self.plan_mix <= 1.0:
            raise ValueError(f"PlaNet-MPC hyperparameter plan_mix must be in [0, 1], got {self.plan_mix}")


class PlanetAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.num_actions = env_spec.num_actions
        self.learner = WorldModelLearner(config, env_spec, self.device)
        self.model: RSSM = self.learner.model

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("PlaNet-MPC plans with a per-episode latent state: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        return torch.randint(0, self.num_actions, (obs.shape[0],)).to(obs.device)   # data collection

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.learner.add(obs, actions, rewards, next_obs, terminated, truncated)

    def update(self) -> dict:
        metrics = {}
        for _ in range(self.learner.due()):
            metrics, _ = self.learner.update()
        return metrics

    def evaluation_policy(self) -> "CEMPolicy":
        return CEMPolicy(self.model, self.config)

    def world_model_rollout(self, obs_prefix, action_prefix, actions, repeat: int = 1) -> torch.Tensor:
        return world_model_rollout(self.model, obs_prefix, action_prefix, actions, repeat)

    def policy_state_dict(self) -> dict:
        return {"model": self.model.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])


def uniforms(words: np.ndarray, count: int) -> torch.Tensor:
    """(N, count) float32 uniforms in [0, 1), a pure function of each row's 64-bit word."""
    stream = step_keys(words[:, None] ^ np.arange(count, dtype=np.uint64)[None, :], 0, PLAN_SALT)
    return torch.from_numpy((stream >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24))


@torch.no_grad()
def score_sequences(model: RSSM, h, z, sequences, remaining, goal=None) -> torch.Tensor:
    """Predicted sum of rewards of each sequence (n, C, D) from each row's state, open loop with the
    prior's mode: sum_d r_d * prod_{i<d} c_i over the depths d < the row's remaining steps; `goal` (n, L) each
    row's goal in the multi-goal protocol (the heads score for it), else None."""
    n, C, D = sequences.shape
    h, z = h.repeat_interleave(C, 0), z.repeat_interleave(C, 0)
    goal = goal.repeat_interleave(C, 0) if goal is not None else None
    total, alive = torch.zeros(n * C, device=h.device), torch.ones(n * C, device=h.device)
    remaining = remaining.repeat_interleave(C, 0)
    for d in range(D):
        h = model.transition(h, z, sequences[:, :, d].reshape(-1))
        z = model.flat(mode_one_hot(model.prior(h)))
        feat = model.features(h, z)
        total = total + alive * model.reward(feat, goal) * (d < remaining)
        alive = alive * model.cont(feat, goal)
    return total.reshape(n, C)


@torch.no_grad()
def cem_plan(model: RSSM, config: Config, h, z, words: np.ndarray, remaining, goal=None) -> torch.Tensor:
    """First action of the best sequence of a categorical CEM, per row: (n,) long (`goal` as `score_sequences`)."""
    c, L = config, model.num_actions
    n, D, C = len(h), c.plan_horizon, c.candidates
    probs = torch.full((n, D, L), 1.0 / L, device=h.device)
    best_score = torch.full((n,), -float("inf"), device=h.device)
    best_action = torch.zeros(n, dtype=torch.long, device=h.device)
    rows = torch.arange(n, device=h.device)
    for it in range(c.iterations):
        u = uniforms(step_keys(words, it, PLAN_SALT), D * C).to(h.device).reshape(n * D, C)
        cdf = probs.cumsum(-1).reshape(n * D, L)
        draws = torch.searchsorted(cdf, u, right=True).clamp(max=L - 1)       # inverse CDF
        sequences = draws.reshape(n, D, C).transpose(1, 2).contiguous()      # (n, C, D)
        scores = score_sequences(model, h, z, sequences, remaining, goal)
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices
        top = order[:, 0]
        better = scores[rows, top] > best_score
        best_score = torch.where(better, scores[rows, top], best_score)
        best_action = torch.where(better, sequences[rows, top, 0], best_action)
        elites = sequences.gather(1, order[:, :c.elites, None].expand(-1, -1, D))   # (n, k, D)
        freq = F.one_hot(elites, L).float().mean(1)                               # (n, D, L)
        probs = (1.0 - c.plan_mix) * freq + c.plan_mix / L
    return best_action


class CEMPolicy:
    """Per row: h filtered through the episode (reset in `begin`), a categorical CEM plan per step."""

    def __init__(self, model: RSSM, config: Config):
        self.model, self.config = model, config

    def begin(self, batch) -> None:
        self.keys, self.H = np.asarray(batch.keys, dtype=np.uint64), int(batch.H)
        self.h = self.model.initial(len(batch), next(self.model.parameters()).device)
        self.t, self._z = 0, None
        self.active = torch.ones(len(batch), dtype=torch.bool, device=self.h.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        self._z = filter_mode(self.model, self.h, obs)
        remaining = (self.H - torch.round(obs[:, -1] * self.H)).long()
        goal = self.model.goal_of(obs)
        words = step_keys(self.keys, self.t, PLAN_SALT)
        actions = torch.zeros(len(obs), dtype=torch.long, device=obs.device)
        # rows whose episode has ended are stepped on with frozen records: no plan for them
        live = self.active.nonzero().squeeze(1)
        for start in range(0, len(live), PLAN_ROWS):
            part = live[start:start + PLAN_ROWS]
            actions[part] = cem_plan(self.model, self.config, self.h[part], self._z[part], words[part.cpu().numpy()],
                                     remaining[part], goal[part] if goal is not None else None)
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.h = self.model.transition(self.h, self._z, actions)
        self._z = None
        self.t += 1
        self.active &= ~(terminated | truncated)


def make(config: Config, env_spec, total_steps: int, device) -> PlanetAgent:
    return PlanetAgent(config, env_spec, total_steps, device)


class PlanetBlock(WorldModelBlock):
    """S PlaNet-MPC agents of one configuration as one seed block (methods/contract.py, "Seed blocks"): the stacked
    world model of `WorldModelBlock`, trained on uniformly random actions drawn from each seed's own generator."""

    label = "PlaNet-MPC"
    agent_type = PlanetAgent

    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("PlaNet-MPC plans with a per-episode latent state: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        n = obs.shape[1]
        return torch.stack([torch.randint(0, self.num_actions, (n,), generator=g)
                            for g in self.generators]).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self._store(obs, actions, rewards, next_obs, terminated, truncated)

    def update(self) -> list[dict]:
        metrics = [{} for _ in range(self.S)]
        for _ in range(self.due()):
            metrics, _ = self._world_model_update()
        return metrics


def make_block(agents: list[PlanetAgent], generators: list[torch.Generator]) -> PlanetBlock:
    """S PlaNet-MPC agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return PlanetBlock(agents, generators)


# as DreamerV3's world model: a block's seeds agree with one-seed runs to rounding, and bit for bit whatever their
# neighbours (a seed's run fingerprint names its block's seeds)
make_block.bit_exact_devices = ()
