"""Context MPC (docs/methods/context_mpc.md): random-shooting MPC through the rule table an in-context world model
(`context_model.py`) reads out of the episode so far.

Training (through the shared loop): uniformly random cells, as the ensemble MPC collects its data. Every
transition goes into one replay with the context its episode had shown before it (the soft table of the episode's
earlier transitions, `context_model.context_counts`); every `train_frequency` environment steps (once
`learning_starts` are collected) the model takes one Adam step on a minibatch: each sample's context keeps every
window's entry with a probability q drawn uniformly in (0, 1) per sample (so the fallback learns to fill in the
unseen entries of a table from the seen ones, at every level of knowledge), and the loss is the negative
log-likelihood of the transition's next tape.

Evaluation (`evaluation_policy()`): per episode a context that starts empty (`begin`) and takes every observed
transition (`observe`). Each step the model's most likely table is the planner's rule, and the planner is the
true-dynamics MPC's (`methods.mpc`): the same candidate keys (`planner_seed` with the episode identity), horizon,
candidates, scoring and ties, on the same kernels, so the planner runs as fast as the true-dynamics MPC and the two
differ only in the table (tested with a table given the true rule).

The world test (`context_tester`): random flips while exploring; the context is every interaction transition
(a reset is no transition), then the test's own tapes. Prediction: the candidate with the highest likelihood under
the predicted table, the masked cells that share a window answering one entry (a candidate whose cells of one window
differ is impossible); planning: the world test's random-shooting planner through the most likely table, the own
planning steps joining the context; detection: the first step where some cell's observed value has probability
below `detect_threshold` under the table (a step that is not flagged joins the context).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tapebench.ca.packed import pack
from tapebench.episodes.streams import episode_keys
from tapebench.episodes.worldtest import act as increment_cells
from tapebench.methods.common import adam
from tapebench.methods.context_model import (ContextModel, cell_probs, context_counts, increment, most_likely, rollout,
                                             windows)
from tapebench.methods.mpc import _plan_actions, _plan_actions_family
from tapebench.methods.worldtest import TesterBase, WorldTestContext, plan_true_rule
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.validation import check_goal


@dataclass
class Config:
    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    colours: int = 2
    """k of the rule family the model reads (cells 0..k-1); must be the split's family (2: elementary)"""
    radius: int = 1
    """r of the rule family the model reads (windows of 2r + 1 cells); must be the split's family"""
    hidden_size: int = 64
    """width of each hidden layer of the fallback network (the learned prior over unseen table entries)"""
    hidden_layers: int = 2
    """hidden layers (ReLU) of the fallback network"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    buffer_size: int = 100_000
    """replay capacity, in transitions"""
    batch_size: int = 64
    """transitions per gradient step"""
    learning_starts: int = 1_000
    """environment steps collected before the first gradient step"""
    train_frequency: int = 16
    """environment steps per gradient step"""
    horizon: int = 8
    """planner: length of each candidate action sequence (the true-dynamics MPC's)"""
    candidates: int = 512
    """planner: random action sequences scored per decision (the true-dynamics MPC's)"""
    planner_seed: int = 0
    """seed of the planner's counter-based candidate sequences (with the episode identity)"""
    detect_threshold: float = 0.05
    """world-test detection: a step is flagged when a cell's observed value has probability below this"""

    def check(self) -> None:
        RuleFamily(self.colours, self.radius)
        positive = ("hidden_size", "hidden_layers", "buffer_size", "batch_size", "train_frequency", "horizon",
                    "candidates")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"Context MPC hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"Context MPC hyperparameter learning_rate must be > 0, got {self.learning_rate}")
        for name in ("learning_starts", "planner_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"Context MPC hyperparameter {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.detect_threshold < 1.0:
            raise ValueError(f"Context MPC hyperparameter detect_threshold must be in (0, 1), got "
                             f"{self.detect_threshold}")

    @property
    def family(self) -> RuleFamily:
        return RuleFamily(self.colours, self.radius)


def check_family(config: Config, family, where: str) -> RuleFamily:
    """The episodes' family must be the one the model reads (`colours`, `radius`)."""
    family = family or ELEMENTARY
    if not isinstance(family, RuleFamily) or (family.k, family.r) != (config.colours, config.radius):
        what = family.describe() if hasattr(family, "describe") else repr(family)
        raise ValueError(f"{where}: the in-context model reads k = {config.colours}, r = {config.radius} tapes "
                         f"(hyperparameters colours, radius), not {what}; set agents.context_mpc.colours and "
                         f"radius to the split's family")
    return family


def table_rules(table: torch.Tensor) -> np.ndarray:
    """(N,) int64 elementary rule numbers of (N, 8, 2) tables: each window's most likely next value."""
    bits = most_likely(table).cpu().numpy().astype(np.int64)
    return (bits << np.arange(bits.shape[1], dtype=np.int64)).sum(axis=1)


# --- replay -------------------------------------------------------------------------------------
class Replay:
    """Ring buffer of transitions (post-action tape, next tape) with the counts of their episode's context."""

    FIELDS = ("counts", "post", "next_tape")

    def __init__(self, capacity: int, L: int, entries: int, k: int, device: torch.device):
        self.capacity, self.device = capacity, device
        self.counts = torch.zeros(capacity, entries, k, dtype=torch.int16, device=device)
        self.post = torch.zeros(capacity, L, dtype=torch.uint8, device=device)
        self.next_tape = torch.zeros(capacity, L, dtype=torch.uint8, device=device)
        self.position = 0
        self.size = 0

    def add(self, counts, post, next_tape) -> None:
        slots = ((self.position + torch.arange(len(post))) % self.capacity).to(self.device)
        self.counts[slots] = counts.clamp_max(torch.iinfo(torch.int16).max).to(torch.int16)
        self.post[slots], self.next_tape[slots] = post.to(torch.uint8), next_tape.to(torch.uint8)
        self.position = (self.position + len(post)) % self.capacity
        self.size = min(self.capacity, self.size + len(post))

    def state_dict(self) -> dict:
        n = self.size
        return {"position": self.position, "size": n,
                **{name: getattr(self, name)[:n].cpu().clone() for name in self.FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        n = state["size"]
        if n > self.capacity:
            raise ValueError(f"replay state holds {n} transitions but buffer_size is {self.capacity}")
        for name in self.FIELDS:
            getattr(self, name)[:n] = state[name].to(self.device)
        self.position, self.size = state["position"], n


# --- the agent ----------------------------------------------------------------------------------
class ContextMPCAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        if env_spec.grid is not None:
            raise ValueError("Context MPC reads 1D tapes (windows of 2r + 1 cells), not the 2D grid family")
        self.config, self.device = config, torch.device(device)
        self.family = config.family
        self.k, self.r, self.L = self.family.k, self.family.r, env_spec.L
        self.model = ContextModel(self.family, config.hidden_size, config.hidden_layers).to(self.device)
        self.optimizer = adam(self.model.parameters(), lr=config.learning_rate)
        self.replay = Replay(config.buffer_size, self.L, self.model.entries, self.k, self.device)
        self.counts = torch.zeros(config.num_envs, self.model.entries, self.k, device=self.device)
        self.env_steps = 0
        self.gradient_steps = 0
        self.next_train_step = config.train_frequency

    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """Training data collection: a uniformly random cell per row (torch's global generator)."""
        if greedy:
            raise ValueError("Context MPC plans with a per-episode context: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        return torch.randint(0, self.L, (obs.shape[0],)).to(obs.device)

    def _tapes(self, obs: torch.Tensor) -> torch.Tensor:
        tapes = obs[:, :self.L].to(self.device).round().long()
        if len(tapes) and (tapes.min() < 0 or tapes.max() >= self.k):
            raise ValueError(f"Context MPC reads k = {self.k} colours (hyperparameter colours) but the tape holds "
                             f"values up to {int(tapes.max())}; set agents.context_mpc.colours to the split's family")
        return tapes

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        post = increment(self._tapes(obs), actions.to(self.device), self.k)
        following = self._tapes(next_obs)
        self.replay.add(self.counts, post, following)
        self.env_steps += len(post)
        self.counts += context_counts(post[:, None], following[:, None], self.k, self.r)
        done = (terminated | truncated).to(self.device)
        self.counts[done] = 0.0          # a row whose episode ended starts with an empty context

    def update(self) -> dict:
        metrics = {}
        while self.env_steps >= self.next_train_step:
            self.next_train_step += self.config.train_frequency
            if self.env_steps >= self.config.learning_starts:
                metrics = self._gradient_step()
        return metrics

    def _gradient_step(self) -> dict:
        c = self.config
        idx = torch.randint(0, self.replay.size, (c.batch_size,)).to(self.device)
        counts = self.replay.counts[idx].float()
        keep_probability = torch.rand(c.batch_size, 1).to(self.device)
        keep = torch.rand(c.batch_size, self.model.entries).to(self.device) < keep_probability
        counts = counts * keep.unsqueeze(-1)
        log_probs = cell_probs(self.model.log_table(counts), self.replay.post[idx], self.k, self.r)
        targets = self.replay.next_tape[idx].long()
        loss = F.nll_loss(log_probs.reshape(-1, self.k), targets.reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.gradient_steps += 1
        with torch.no_grad():
            error = (log_probs.argmax(-1) != targets).float().mean()
        return {"model_loss": loss.item(), "model_cell_error": error.item(),
                "pseudo_count": self.model.pseudo_count().item()}

    # --- evaluation -------------------------------------------------------------------------
    def evaluation_policy(self) -> "ContextPlanner":
        return ContextPlanner(self.model, self.config, self.device)

    @torch.no_grad()
    def world_model_rollout(self, obs_prefix, action_prefix, actions, repeat: int = 1) -> torch.Tensor:
        """(N * repeat, D, L) probability of each cell being 1 after each of the D `actions`, open loop through the
        table the prefix's transitions predict (agent contract; binary tapes only)."""
        return rollout(self.model, self.L, obs_prefix, action_prefix, actions, repeat)

    # --- checkpointing ----------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"model": self.model.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "replay": self.replay.state_dict(), "counts": self.counts.cpu().clone(),
                "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                             "next_train_step": self.next_train_step}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.counts = state["counts"].to(self.device).clone()
        for name, value in state["counters"].items():
            setattr(self, name, value)


# --- the planner --------------------------------------------------------------------------------
class ContextPlanner:
    """The true-dynamics MPC's planner through the model's most likely table (an EvalPolicy). Per-episode state:
    the context's counts, empty at `begin`, every observed transition of a running episode added."""

    def __init__(self, model: ContextModel, config: Config, device):
        self.model, self.config, self.device = model, config, torch.device(device)
        self.k, self.r = model.k, model.r

    def begin(self, batch) -> None:
        self.family = check_family(self.config, batch.family, "Context MPC evaluation")
        n, self.L, self.H, self.t = len(batch), batch.L, batch.H, 0
        self.keys = episode_keys(batch.keys, self.config.planner_seed)
        if self.family.elementary:
            self.goals = pack(np.ascontiguousarray(batch.row_goals()))
        else:
            self.goal = check_goal(batch.goal, batch.L, family=self.family)
        self.score_bonus = float(batch.success_bonus) * batch.L
        self.active = np.ones(n, dtype=np.bool_)
        self.counts = torch.zeros(n, self.model.entries, self.k, device=self.device)

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        """(N, E, k) the model's table for every episode's context so far."""
        return self.model.table(self.counts)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        cells = obs[:, :self.L].round().to(torch.uint8).cpu().numpy()
        c = self.config
        table = self.table()
        if self.family.elementary:
            actions = _plan_actions(pack(cells), table_rules(table), self.keys, self.active, self.t, self.H, self.L,
                                    self.goals, self.score_bonus, int(c.horizon), int(c.candidates))
        else:
            tables = np.ascontiguousarray(most_likely(table).cpu().numpy().astype(np.uint8))
            actions = _plan_actions_family(np.ascontiguousarray(cells), tables, self.keys, self.active, self.t,
                                           self.H, self.L, self.goal, self.score_bonus, int(c.horizon),
                                           int(c.candidates), self.k, self.r)
        return torch.from_numpy(actions).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        rows = torch.from_numpy(self.active).to(self.device)
        post = increment(obs[:, :self.L].to(self.device).round().long(), actions.to(self.device), self.k)
        following = next_obs[:, :self.L].to(self.device).round().long()
        self.counts += context_counts(post[:, None], following[:, None], self.k, self.r, rows[:, None])
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


def make(config: Config, env_spec, total_steps: int, device) -> ContextMPCAgent:
    return ContextMPCAgent(config, env_spec, total_steps, device)


# --- the world test -----------------------------------------------------------------------------
class ContextModelTester(TesterBase):
    """The in-context model answering the world test (module docstring): its context is every transition it has
    seen of the row's hidden rule, interaction and test alike."""

    def __init__(self, context: WorldTestContext):
        super().__init__(context)
        agent = context.agent
        if not isinstance(agent, ContextMPCAgent):
            raise ValueError("the in-context world tester needs a trained Context MPC agent (registry id "
                             "context_mpc) in context.agent")
        self.model, self.config = agent.model, agent.config
        self.family = check_family(agent.config, context.family, "Context MPC world test")
        self.k, self.r = self.family.k, self.family.r

    def explore_begin(self, batch) -> None:
        super().explore_begin(batch)
        self.counts = torch.zeros(len(batch), self.model.entries, self.k)

    def _add(self, counts, before, actions, after, rows) -> None:
        """Add the transitions of `rows` (bool (N,)) to `counts` in place."""
        posts = increment_cells(before, np.where(rows, actions, 0), self.k)
        counts += context_counts(torch.from_numpy(posts.astype(np.int64))[:, None],
                                 torch.from_numpy(np.asarray(after, dtype=np.int64))[:, None], self.k, self.r,
                                 torch.from_numpy(np.asarray(rows, dtype=bool))[:, None])

    def explore_observe(self, tapes, actions, next_tapes) -> None:
        self._add(self.counts, tapes, actions, next_tapes, actions < self.L)   # a reset is no transition

    @torch.no_grad()
    def _log_table(self, counts) -> np.ndarray:
        return self.model.log_table(counts).cpu().numpy()

    def predict(self, problems):
        counts = self.counts.clone()
        everyone = np.ones(len(problems), dtype=bool)
        for t in range(problems.T - 1):
            self._add(counts, problems.tapes[:, t], problems.actions[:, t], problems.tapes[:, t + 1], everyone)
        log_table = self._log_table(counts)
        posts = increment_cells(problems.tapes[:, -1], problems.actions[:, -1], self.k)
        entries = windows(torch.from_numpy(posts.astype(np.int64)), self.k, self.r).numpy()
        return candidate_choice(log_table, entries, problems.mask, problems.candidates)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        with torch.no_grad():
            rules = table_rules(self.model.table(self.counts))
        return plan_true_rule(pack(tapes), rules, self.goal_words, self.planner_keys, self.active, t,
                               self.planning.horizon, self.L, bonus, horizon, candidates)

    def plan_observe(self, tapes, actions, next_tapes) -> None:
        self._add(self.counts, tapes, actions, next_tapes, self.active)
        super().plan_observe(tapes, actions, next_tapes)

    def detect_begin(self, problems) -> None:
        pass

    def detect_step(self, t, before, actions, after):
        log_table = torch.from_numpy(self._log_table(self.counts))
        posts = torch.from_numpy(increment_cells(before, actions, self.k).astype(np.int64))
        observed = cell_probs(log_table, posts, self.k, self.r).gather(
            -1, torch.from_numpy(np.asarray(after, dtype=np.int64)).unsqueeze(-1)).squeeze(-1)
        flagged = (observed < float(np.log(self.config.detect_threshold))).any(dim=1).numpy()
        self._add(self.counts, before, actions, after, ~flagged)
        return flagged


def candidate_choice(log_table: np.ndarray, entries: np.ndarray, mask: np.ndarray, candidates: np.ndarray) \
        -> np.ndarray:
    """(N,) the most likely candidate (ties: lowest index). log_table (N, E, k), entries (N, L) each cell's window,
    mask (N, L) the masked cells, candidates (N, C, M) their values. A candidate's log-likelihood sums, over the
    distinct windows of its masked cells, the table's log-probability of the value it shows there; a candidate whose
    cells of one window show two values is impossible (-inf)."""
    n = len(candidates)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        e = entries[i, mask[i]]                                   # (M,)
        first = np.argmax(e[:, None] == e[None, :], axis=1)       # each cell's first cell of the same window
        values = candidates[i].astype(np.int64)                   # (C, M)
        possible = np.all(values == values[:, first], axis=1)
        leader = first == np.arange(len(e))
        score = log_table[i, e[leader][None, :], values[:, leader]].sum(axis=1)
        out[i] = int(np.argmax(np.where(possible, score, -np.inf)))
    return out


def context_tester(config, context: WorldTestContext) -> ContextModelTester:
    return ContextModelTester(context)


context_tester.any_rule_family = True   # prediction and detection on any family the model was trained on
