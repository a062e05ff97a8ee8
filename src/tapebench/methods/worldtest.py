"""The world-test interface (docs/methods.md#world-test) and the built-in world testers.

A world tester is what a method answers the world test with (docs/protocol.md#world-test). The runner
(`evaluation.worldtest`) drives N rows at once; row i has its own hidden rule and problem. For each task it
builds a fresh tester (`Method.worldtest(config, context)`) and calls

* `explore_begin(batch)`, then, `batch.budget` times, `explore_act(tapes, step) -> (N,) int64` (a cell
  0..L-1, or `reset_action(L)` = L for a fresh random tape; both cost one step of the budget) and
  `explore_observe(tapes, actions, next_tapes)`. No reward, no goal; tapes are (N, L) uint8;
* then one task:
  - `predict(problems: PredictionProblems) -> (N,) int64` candidate indices (0..5);
  - `plan_begin(problems: PlanningProblems)`, then each step `plan_act(tapes, t) -> (N,) int64` cells and
    `plan_observe(tapes, actions, next_tapes)`; rows that reached their goal keep being called, their actions
    are ignored;
  - `detect_begin(problems: DetectionProblems)`, then for t = 1..T `detect_step(t, before, actions, after) ->
    (N,) bool`: True reports "the rule changed at step t" (the first True of a row counts). A tester never
    sees a tape before its step.

A row's answers may depend only on that row's own observations and on `batch.keys[i]` (its identity, for
reproducible randomness). Only methods that see the true rule (`Method.sees_true_rule`) get `batch.rules`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numba as nb
import numpy as np

from tapebench.ca.packed import pack, step_word
from tapebench.episodes.streams import U64, candidate_actions, episode_keys, step_key, step_keys, uniform_below
from tapebench.episodes.worldtest import random_actions, transition
from tapebench.methods.identify_then_plan import consistent_rules, decide, pinned_bits
from tapebench.methods.mpc import _plan_action
from tapebench.vocabulary import PREDICTION_CANDIDATES

PREDICT_DOMAIN = 0x505245    # separates a tester's per-row streams of one seed
DETECT_DOMAIN = 0x444554
PLAN_DOMAIN = 0x504C4E


def reset_action(L: int) -> int:
    """The interaction phase's reset: a fresh random tape instead of a flip (costs one step)."""
    return int(L)


@dataclass(frozen=True)
class WorldTestBatch:
    """What a tester learns about the rows before the interaction phase."""

    L: int
    budget: int              # interaction steps (resets included)
    keys: np.ndarray         # (N,) uint64 row identities
    rules: np.ndarray | None = None   # (N,) hidden rules: only for methods that see the true rule

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class WorldTestContext:
    """What the protocol gives `Method.worldtest(config, context)`."""

    L: int
    H: int                   # the training horizon (a learned model's time feature t/H)
    seed: int                # the method's seed stream (and the run's seed for methods that train)
    planner_horizon: int = 8      # the random-shooting planner every world-test method plans with
    planner_candidates: int = 128
    success_bonus: float = 1.0    # the planner's score of a reached goal, as the environment's reward
    agent: Any = None        # methods that train: the agent with its final checkpoint's policy loaded
    device: Any = "cpu"


@runtime_checkable
class WorldTester(Protocol):
    def explore_begin(self, batch: WorldTestBatch) -> None: ...

    def explore_act(self, tapes: np.ndarray, step: int) -> np.ndarray: ...

    def explore_observe(self, tapes: np.ndarray, actions: np.ndarray, next_tapes: np.ndarray) -> None: ...

    def predict(self, problems) -> np.ndarray: ...

    def plan_begin(self, problems) -> None: ...

    def plan_act(self, tapes: np.ndarray, t: int) -> np.ndarray: ...

    def plan_observe(self, tapes: np.ndarray, actions: np.ndarray, next_tapes: np.ndarray) -> None: ...

    def detect_begin(self, problems) -> None: ...

    def detect_step(self, t: int, before: np.ndarray, actions: np.ndarray, after: np.ndarray) -> np.ndarray: ...


def match_candidate(candidates: np.ndarray, mask: np.ndarray, tapes: np.ndarray) -> np.ndarray:
    """(N,) index of the candidate equal to each row's tape on its masked cells (-1 if none)."""
    values = np.stack([tapes[i, mask[i]] for i in range(len(tapes))])
    hits = np.all(candidates == values[:, None, :], axis=2)
    return np.where(hits.any(axis=1), np.argmax(hits, axis=1), -1)


class _Tester:
    """Shared bookkeeping: the rows, the seed, random cells per step."""

    def __init__(self, context: WorldTestContext):
        self.context = context
        self.seed = int(context.seed)

    def explore_begin(self, batch: WorldTestBatch) -> None:
        self.batch, self.L = batch, batch.L

    def explore_act(self, tapes, step):
        return random_actions(self.batch.keys, step, self.seed, self.L)

    def explore_observe(self, tapes, actions, next_tapes) -> None:
        pass

    def plan_begin(self, problems) -> None:
        self.planning = problems
        self.planner_keys = episode_keys(step_keys(self.batch.keys, PLAN_DOMAIN, self.seed), self.seed)
        self.goal_words = pack(problems.goals)
        self.active = np.ones(len(problems), dtype=np.bool_)

    def plan_observe(self, tapes, actions, next_tapes) -> None:
        self.active &= np.any(next_tapes != self.planning.goals, axis=1)

    def _planner(self):
        c = self.context
        return int(c.planner_horizon), int(c.planner_candidates), float(c.success_bonus) * self.L


class ChanceTester(_Tester):
    """The chance row: random cells while exploring and planning, uniform answers, a uniform report step."""

    def predict(self, problems):
        words = step_keys(self.batch.keys, PREDICT_DOMAIN + problems.T, self.seed)
        return uniform_below(words, PREDICTION_CANDIDATES)

    def plan_act(self, tapes, t):
        return random_actions(self.batch.keys, PLAN_DOMAIN + t, self.seed, self.L)

    def detect_begin(self, problems) -> None:
        self.report = 1 + uniform_below(step_keys(self.batch.keys, DETECT_DOMAIN, self.seed), problems.T)

    def detect_step(self, t, before, actions, after):
        return self.report == t


@nb.njit(cache=True)
def _plan_true_rule(states, rules, goals, keys, active, t, H, L, score_bonus, horizon, candidates):
    out = np.zeros(states.shape[0], dtype=np.int64)
    tapes = np.empty(candidates, dtype=np.uint64)
    score = np.empty(candidates, dtype=np.float64)
    alive = np.empty(candidates, dtype=np.float64)
    depth = min(horizon, H - t)
    for i in range(states.shape[0]):
        if active[i]:
            out[i] = _plan_action(states[i], rules[i], step_key(keys[i], t), depth, L, goals[i], score_bonus,
                                  horizon, candidates, tapes, score, alive)
    return out


class TrueRuleTester(_Tester):
    """The reference: knows each row's rule. Predicts the true next tape, plans with true-dynamics MPC, reports
    the first step the rule does not produce (exactly the earliest detectable step)."""

    def explore_begin(self, batch: WorldTestBatch) -> None:
        if batch.rules is None:
            raise ValueError("the true-rule world tester is a reference and needs each row's rule "
                             "(its registry entry must have sees_true_rule=True)")
        super().explore_begin(batch)
        self.rules = np.asarray(batch.rules, dtype=np.int64)

    def predict(self, problems):
        final = transition(problems.tapes[:, -1], problems.actions[:, -1], self.rules)
        return match_candidate(problems.candidates, problems.mask, final)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        return _plan_true_rule(pack(tapes), self.rules, self.goal_words, self.planner_keys, self.active, t,
                               self.planning.horizon, self.L, bonus, horizon, candidates)

    def detect_begin(self, problems) -> None:
        pass

    def detect_step(self, t, before, actions, after):
        return np.any(transition(before, actions, self.rules) != after, axis=1)


@nb.njit(cache=True)
def _pin_rows(known_mask, known_values, before, actions, after, rows, L):
    """Pin the table bits each row's transition shows; (N,) True where it contradicts the row's pins (those
    rows keep their pins unchanged)."""
    clash = np.zeros(before.shape[0], dtype=np.bool_)
    for i in range(before.shape[0]):
        if not rows[i]:
            continue
        km, kv, ok = pinned_bits(before[i] ^ (U64(1) << U64(actions[i])), after[i], L)
        if not ok or (km & known_mask[i] & (kv ^ known_values[i])) != 0:
            clash[i] = True
            continue
        known_mask[i] |= km
        known_values[i] |= kv
    return clash


@nb.njit(cache=True)
def _most_informative(states, known_mask, L):
    """Per row: the flip whose post-action tape shows the most table bits not yet pinned (lowest cell on ties);
    a reset (L) when no flip shows a new one and some bit is still unknown."""
    out = np.zeros(states.shape[0], dtype=np.int64)
    for i in range(states.shape[0]):
        if known_mask[i] == 0xFF:
            continue
        best, best_gain = L, 0
        for a in range(L):
            km, kv, ok = pinned_bits(states[i] ^ (U64(1) << U64(a)), states[i], L)
            gain = 0
            unknown = km & ~known_mask[i]
            for k in range(8):
                gain += (unknown >> k) & 1
            if gain > best_gain:
                best, best_gain = a, gain
        out[i] = best
    return out


@nb.njit(cache=True)
def _votes(known_mask, known_values, last, L, cell_masks, candidate_words):
    """Per row: how many consistent rules produce each candidate's masked cells from the last shown step."""
    n, c = candidate_words.shape
    out = np.zeros((n, c), dtype=np.int64)
    for i in range(n):
        rules = consistent_rules(known_mask[i], known_values[i], 256)
        for z in rules:
            x = last[i]
            nxt = step_word(x, z, L)
            for j in range(c):
                if (nxt & cell_masks[i]) == candidate_words[i, j]:
                    out[i, j] += 1
    return out


@nb.njit(cache=True)
def _plan_consistent(states, known_mask, known_values, goals, keys, active, t, H, L, score_bonus, horizon,
                     candidates):
    out = np.zeros(states.shape[0], dtype=np.int64)
    depth = min(horizon, H - t)
    for i in range(states.shape[0]):
        if active[i]:
            rules = consistent_rules(known_mask[i], known_values[i], 256)
            out[i] = decide(states[i], rules, step_key(keys[i], t), depth, L, goals[i], score_bonus, horizon,
                            candidates)
    return out


class ExactReasoningTester(_Tester):
    """Exact reasoning over the rule tables consistent with everything observed (identify-then-plan's
    machinery). `active=False`: random flips while exploring; `active=True`: each step the flip that shows the
    most table bits not yet pinned (the consistent set shrinks by 2^bits), a reset when no flip shows one.

    Prediction: the candidate most consistent rules produce (ties: lowest index). Planning: random shooting
    scored by the summed return over the consistent rules. Detection: the first transition that contradicts
    the pinned bits; a transition that does not contradict them is pinned like any other."""

    def __init__(self, context: WorldTestContext, active: bool):
        super().__init__(context)
        self.active_exploration = bool(active)

    def explore_begin(self, batch: WorldTestBatch) -> None:
        super().explore_begin(batch)
        self.known_mask = np.zeros(len(batch), dtype=np.int64)
        self.known_values = np.zeros(len(batch), dtype=np.int64)

    def explore_act(self, tapes, step):
        if self.active_exploration:
            return _most_informative(pack(tapes), self.known_mask, self.L)
        return super().explore_act(tapes, step)

    def explore_observe(self, tapes, actions, next_tapes) -> None:
        self._pin(tapes, actions, next_tapes, actions < self.L)

    def _pin(self, before, actions, after, rows, mask=None, values=None):
        mask = self.known_mask if mask is None else mask
        values = self.known_values if values is None else values
        return _pin_rows(mask, values, pack(before), np.where(rows, actions, 0).astype(np.int64), pack(after),
                         np.asarray(rows, dtype=np.bool_), self.L)

    def consistent(self, row: int) -> np.ndarray:
        return consistent_rules(self.known_mask[row], self.known_values[row], 256)

    def predict(self, problems):
        mask, values = self.known_mask.copy(), self.known_values.copy()
        everyone = np.ones(len(problems), dtype=np.bool_)
        for t in range(problems.T - 1):
            self._pin(problems.tapes[:, t], problems.actions[:, t], problems.tapes[:, t + 1], everyone, mask, values)
        last = pack(problems.tapes[:, -1]) ^ (U64(1) << problems.actions[:, -1].astype(np.uint64))
        cell_masks = pack(problems.mask.astype(np.uint8))
        candidate_words = np.zeros(problems.candidates.shape[:2], dtype=np.uint64)
        for i in range(len(problems)):
            full = np.zeros((problems.candidates.shape[1], self.L), dtype=np.uint8)
            full[:, problems.mask[i]] = problems.candidates[i]
            candidate_words[i] = pack(full)
        votes = _votes(mask, values, last, self.L, cell_masks, candidate_words)
        return np.argmax(votes, axis=1).astype(np.int64)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        return _plan_consistent(pack(tapes), self.known_mask, self.known_values, self.goal_words, self.planner_keys,
                                self.active, t, self.planning.horizon, self.L, bonus, horizon, candidates)

    def plan_observe(self, tapes, actions, next_tapes) -> None:
        self._pin(tapes, actions, next_tapes, self.active)
        super().plan_observe(tapes, actions, next_tapes)

    def detect_begin(self, problems) -> None:
        pass

    def detect_step(self, t, before, actions, after):
        return self._pin(before, actions, after, np.ones(len(before), dtype=np.bool_))


@nb.njit(cache=True)
def _candidate_plans(keys, t, candidates, horizon, L):
    """(N, candidates, horizon): the candidate action sequences of step t, as the true-dynamics MPC draws them."""
    out = np.empty((keys.shape[0], candidates, horizon), dtype=np.int64)
    for i in range(keys.shape[0]):
        out[i] = candidate_actions(step_key(keys[i], t), candidates, horizon, L)
    return out


JOIN_ACTION = 0   # the action a learned model is shown where the interaction context jumps to the test's tape


class LearnedModelTester(_Tester):
    """A learned world model (an agent with `world_model_rollout`, agent contract) trained on the training
    rules, adapting to the hidden rule only through what it observes.

    It explores with random flips. Its context is the last `H // 2` interaction transitions (all of them when
    the budget is smaller), followed by the test's own tapes as one sequence (the tape jumps where the test
    begins, shown as a flip of cell 0; the time feature is the position in the sequence over H, capped at 1).
    Prediction: the candidate with the highest likelihood of the masked cells under the one-step prediction.
    Detection: the first step whose tape differs from the model's most likely next tape (cells thresholded at
    0.5). Planning: the world test's random shooting, each candidate rolled out open loop by the model from the
    sequence so far and scored like the true-dynamics MPC on the thresholded predictions."""

    CHUNK = 16   # planning rows rolled out together (each with all its candidates)

    def __init__(self, context: WorldTestContext):
        super().__init__(context)
        if context.agent is None or not hasattr(context.agent, "world_model_rollout"):
            raise ValueError("a learned world tester needs a trained agent with world_model_rollout "
                             "(a registry entry with world_model=True)")
        self.agent = context.agent
        self.repeats = "repeat" in inspect.signature(context.agent.world_model_rollout).parameters

    def explore_begin(self, batch: WorldTestBatch) -> None:
        super().explore_begin(batch)
        self.seen_tapes, self.seen_actions = [], []

    def explore_observe(self, tapes, actions, next_tapes) -> None:
        if not self.seen_tapes:
            self.seen_tapes.append(tapes)
        self.seen_tapes.append(next_tapes)
        self.seen_actions.append(actions)

    def _sequence(self, tapes: np.ndarray, actions: np.ndarray, rows=None, repeat: int = 1):
        """(obs_prefix, action_prefix) tensors: the context of `rows` (all by default), each repeated `repeat`
        times, then `tapes` (n, k+1, L) with `actions` (n, k)."""
        # torch is heavy: loaded only when a learned model answers
        import torch

        window = min(len(self.seen_actions), self.context.H // 2)
        if window > 0 and len(self.seen_tapes) > 0:
            rows = slice(None) if rows is None else rows
            ctx_tapes = np.repeat(np.stack(self.seen_tapes[-(window + 1):], axis=1)[rows], repeat, axis=0)
            ctx_actions = np.repeat(np.stack(self.seen_actions[-window:], axis=1)[rows], repeat, axis=0)
            join = np.full((len(tapes), 1), JOIN_ACTION, dtype=np.int64)
            tapes = np.concatenate([ctx_tapes, tapes], axis=1)
            actions = np.concatenate([ctx_actions, join, actions], axis=1)
        n, length, L = tapes.shape
        H = self.context.H
        time = np.minimum(np.arange(length), H) / H
        obs = np.concatenate([tapes.astype(np.float32), np.broadcast_to(time, (n, length))[..., None]], axis=2)
        actions = np.where(actions >= L, JOIN_ACTION, actions)   # a reset in the context is shown as a jump
        return torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(actions, dtype=torch.long)

    def _rollout(self, tapes, actions, following, rows=None, repeat: int = 1):
        """Probabilities after `following`; `tapes`/`actions` hold one prefix per `repeat` rows of `following`."""
        # torch is heavy: loaded only when a learned model answers
        import torch

        following = torch.as_tensor(following, dtype=torch.long)
        with torch.no_grad():
            if repeat != 1 and self.repeats:
                obs, acts = self._sequence(tapes, actions, rows)
                probs = self.agent.world_model_rollout(obs, acts, following, repeat=repeat)
            else:
                obs, acts = self._sequence(np.repeat(tapes, repeat, axis=0), np.repeat(actions, repeat, axis=0),
                                           rows, repeat)
                probs = self.agent.world_model_rollout(obs, acts, following)
        return probs.cpu().numpy()

    def predict(self, problems):
        probs = self._rollout(problems.tapes, problems.actions[:, :-1], problems.actions[:, -1:])[:, 0]
        p = np.clip(probs, 1e-6, 1 - 1e-6)
        scores = np.zeros(problems.candidates.shape[:2])
        for i in range(len(problems)):
            q = p[i, problems.mask[i]]
            c = problems.candidates[i].astype(np.float64)
            scores[i] = (c * np.log(q) + (1 - c) * np.log(1 - q)).sum(axis=1)
        return np.argmax(scores, axis=1).astype(np.int64)

    def detect_begin(self, problems) -> None:
        self.watched = [problems.starts]
        self.watched_actions = []

    def detect_step(self, t, before, actions, after):
        tapes = np.stack(self.watched, axis=1)
        prefix_actions = np.stack(self.watched_actions, axis=1) if self.watched_actions else \
            np.zeros((len(after), 0), dtype=np.int64)
        probs = self._rollout(tapes, prefix_actions, actions[:, None])[:, 0]
        self.watched.append(after)
        self.watched_actions.append(actions)
        return np.any((probs > 0.5) != after.astype(bool), axis=1)

    def plan_begin(self, problems) -> None:
        super().plan_begin(problems)
        self.trajectory = [problems.starts]
        self.trajectory_actions = []

    def plan_observe(self, tapes, actions, next_tapes) -> None:
        super().plan_observe(tapes, actions, next_tapes)
        self.trajectory.append(next_tapes)
        self.trajectory_actions.append(actions)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        depth = min(horizon, self.planning.horizon - t)
        out = np.zeros(len(tapes), dtype=np.int64)
        rows = np.flatnonzero(self.active)
        path = np.stack(self.trajectory, axis=1)
        path_actions = np.stack(self.trajectory_actions, axis=1) if self.trajectory_actions else \
            np.zeros((len(tapes), 0), dtype=np.int64)
        for start in range(0, len(rows), self.CHUNK):
            chunk = rows[start:start + self.CHUNK]
            plans = _candidate_plans(self.planner_keys[chunk], t, candidates, horizon, self.L)[:, :, :depth]
            probs = self._rollout(path[chunk], path_actions[chunk], plans.reshape(-1, depth), chunk, candidates)
            predicted = (probs > 0.5).reshape(len(chunk), candidates, depth, self.L)
            goals = self.planning.goals[chunk].astype(bool)[:, None, None, :]
            mismatch = (predicted != goals).sum(axis=3)
            score = np.zeros((len(chunk), candidates))
            alive = np.ones((len(chunk), candidates))
            for k in range(depth):
                hit = mismatch[:, :, k] == 0
                score += alive * np.where(hit, bonus, -mismatch[:, :, k])
                alive = np.where(hit, 0.0, alive)
            out[chunk] = plans[np.arange(len(chunk)), np.argmax(score, axis=1), 0]
        return out


def chance_tester(config, context: WorldTestContext) -> ChanceTester:
    return ChanceTester(context)


def true_rule_tester(config, context: WorldTestContext) -> TrueRuleTester:
    return TrueRuleTester(context)


def random_exploration_tester(config, context: WorldTestContext) -> ExactReasoningTester:
    return ExactReasoningTester(context, active=False)


def active_exploration_tester(config, context: WorldTestContext) -> ExactReasoningTester:
    return ExactReasoningTester(context, active=True)


def learned_model_tester(config, context: WorldTestContext) -> LearnedModelTester:
    return LearnedModelTester(context)


@dataclass
class ActiveConfig:
    """Active exploration + exact reasoning has no hyperparameters (its planner is the world test's)."""
