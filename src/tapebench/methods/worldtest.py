"""The world-test interface (docs/methods/README.md#the-world-test-interface) and the built-in world testers.

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
from tapebench.episodes.worldtest import act, neighbourhood_indices, random_actions, transition
from tapebench.methods.identify_then_plan import consistent_rules, decide
from tapebench.methods.mpc import _plan_action
from tapebench.rule_family import ELEMENTARY, RuleFamily
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
    family: RuleFamily = ELEMENTARY   # the hidden rules' family (k colours, radius r)


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


class TesterBase:
    """The bookkeeping every world tester shares (this module's and other methods', e.g. Context MPC's): the rows,
    the seed, random cells per exploration step, the planning problems' keys, goals and active rows."""

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


class ChanceTester(TesterBase):
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
def plan_true_rule(states, rules, goals, keys, active, t, H, L, score_bonus, horizon, candidates):
    """The true MPC's action for each active row at step t of a planning problem: random shooting with the row's
    rule `rules[i]` (the hidden rule, or the one a tester has read out) towards its goal word `goals[i]`."""
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


class TrueRuleTester(TesterBase):
    """The reference: knows each row's rule. Predicts the true next tape, plans with true-dynamics MPC, reports
    the first step the rule does not produce (exactly the earliest detectable step)."""

    def explore_begin(self, batch: WorldTestBatch) -> None:
        if batch.rules is None:
            raise ValueError("the true-rule world tester is a reference and needs each row's rule "
                             "(its registry entry must have sees_true_rule=True)")
        super().explore_begin(batch)
        self.rules = np.asarray(batch.rules, dtype=np.int64)

    def predict(self, problems):
        final = transition(problems.tapes[:, -1], problems.actions[:, -1], self.rules, self.context.family)
        return match_candidate(problems.candidates, problems.mask, final)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        return plan_true_rule(pack(tapes), self.rules, self.goal_words, self.planner_keys, self.active, t,
                               self.planning.horizon, self.L, bonus, horizon, candidates)

    def detect_begin(self, problems) -> None:
        pass

    def detect_step(self, t, before, actions, after):
        return np.any(transition(before, actions, self.rules, self.context.family) != after, axis=1)


UNPINNED = -1   # a rule-table entry no observed transition has shown


@nb.njit(cache=True)
def _pin_tables(pins, posts, after, rows, k, r):
    """Pin, per row, the table entries its transition shows: the neighbourhood of each cell of the post-action
    tape maps to that cell's next value. (N,) True where the transition contradicts the row's pins or itself
    (one neighbourhood shown with two outputs); those rows keep their pins unchanged."""
    n, L = posts.shape
    clash = np.zeros(n, dtype=np.bool_)
    staged = np.empty(pins.shape[1], dtype=pins.dtype)
    for i in range(n):
        if not rows[i]:
            continue
        staged[:] = pins[i]
        for c in range(L):
            idx = 0
            for j in range(-r, r + 1):
                idx = idx * k + posts[i, (c + j) % L]
            if staged[idx] == UNPINNED:
                staged[idx] = after[i, c]
            elif staged[idx] != after[i, c]:
                clash[i] = True
                break
        if not clash[i]:
            pins[i] = staged
    return clash


@nb.njit(cache=True)
def _most_informative(tapes, pins, k, r):
    """Per row: the action (increment of a cell mod k) whose post-action tape shows the most table entries not
    yet pinned (lowest cell on ties); a reset (L) when no action shows a new one and some entry is unknown;
    cell 0 when every entry is pinned."""
    n, L = tapes.shape
    out = np.zeros(n, dtype=np.int64)
    stamp = np.zeros(pins.shape[1], dtype=np.int64)
    post = np.empty(L, dtype=np.int64)
    mark = 0
    for i in range(n):
        if not np.any(pins[i] == UNPINNED):
            continue
        best, best_gain = L, 0
        for a in range(L):
            for c in range(L):
                post[c] = tapes[i, c]
            post[a] = (post[a] + 1) % k
            mark += 1
            gain = 0
            for c in range(L):
                idx = 0
                for j in range(-r, r + 1):
                    idx = idx * k + post[(c + j) % L]
                if pins[i, idx] == UNPINNED and stamp[idx] != mark:
                    stamp[idx] = mark
                    gain += 1
            if gain > best_gain:
                best, best_gain = a, gain
        out[i] = best
    return out


@nb.njit(cache=True)
def _compatible_candidate(pins, idx, candidates):
    """Per row: the lowest candidate the consistent tables can produce (-1: none). A candidate is produced by
    some consistent table iff every masked cell whose neighbourhood entry is pinned shows the pinned value and
    cells sharing an unpinned entry show one value; every such candidate is produced by the same number of
    consistent tables (k^(unpinned entries - unpinned entries shown)), so this is the most-produced one."""
    n, c, m = candidates.shape
    out = np.full(n, -1, dtype=np.int64)
    staged = np.empty(pins.shape[1], dtype=pins.dtype)
    for i in range(n):
        for j in range(c):
            staged[:] = pins[i]
            ok = True
            for q in range(m):
                e = idx[i, q]
                if staged[e] == UNPINNED:
                    staged[e] = candidates[i, j, q]
                elif staged[e] != candidates[i, j, q]:
                    ok = False
                    break
            if ok:
                out[i] = j
                break
    return out


def pins_to_bits(pins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Elementary pins (N, 8) as identify-then-plan's (known_mask, known_values) bytes."""
    weights = np.int64(1) << np.arange(pins.shape[1], dtype=np.int64)
    known = pins != UNPINNED
    return (known * weights).sum(axis=1).astype(np.int64), ((pins == 1) * weights).sum(axis=1).astype(np.int64)


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


class ExactReasoningTester(TesterBase):
    """Exact reasoning over the rule tables consistent with everything observed, in any rule family: each
    observed transition pins the table entries of the neighbourhoods its post-action tape shows, and the
    consistent tables are those that agree with every pin (all values of the unpinned entries). `active=False`:
    random actions while exploring; `active=True`: each step the action whose post-action tape shows the most
    entries not yet pinned, a reset when no action shows one.

    Prediction: a candidate the most consistent tables produce (ties: lowest index). Planning (the elementary
    family): random shooting scored by the summed return over the consistent rules (identify-then-plan's
    planner). Detection: the first transition that contradicts the pins; a transition that does not contradict
    them is pinned like any other."""

    def __init__(self, context: WorldTestContext, active: bool):
        super().__init__(context)
        self.active_exploration = bool(active)
        self.family = context.family

    def explore_begin(self, batch: WorldTestBatch) -> None:
        super().explore_begin(batch)
        self.pins = np.full((len(batch), self.family.neighbourhoods), UNPINNED, dtype=np.int8)

    @property
    def known_mask(self) -> np.ndarray:
        """(N,) int64, elementary family: the pinned bits of each row's table."""
        return pins_to_bits(self.pins)[0]

    @property
    def known_values(self) -> np.ndarray:
        return pins_to_bits(self.pins)[1]

    def explore_act(self, tapes, step):
        if self.active_exploration:
            return _most_informative(np.ascontiguousarray(tapes, dtype=np.uint8), self.pins, self.family.k,
                                     self.family.r)
        return super().explore_act(tapes, step)

    def explore_observe(self, tapes, actions, next_tapes) -> None:
        self._pin(tapes, actions, next_tapes, actions < self.L)

    def _pin(self, before, actions, after, rows, pins=None):
        pins = self.pins if pins is None else pins
        posts = act(before, np.where(rows, actions, 0), self.family.k)
        return _pin_tables(pins, posts, np.ascontiguousarray(after, dtype=np.uint8), np.asarray(rows, dtype=np.bool_),
                           self.family.k, self.family.r)

    def consistent(self, row: int) -> np.ndarray:
        """Elementary family: the rules consistent with row `row`'s pins, ascending."""
        return consistent_rules(self.known_mask[row], self.known_values[row], 256)

    def predict(self, problems):
        pins = self.pins.copy()
        everyone = np.ones(len(problems), dtype=np.bool_)
        for t in range(problems.T - 1):
            self._pin(problems.tapes[:, t], problems.actions[:, t], problems.tapes[:, t + 1], everyone, pins)
        posts = act(problems.tapes[:, -1], problems.actions[:, -1], self.family.k)
        entries = neighbourhood_indices(posts, self.family)
        idx = np.stack([entries[i, problems.mask[i]] for i in range(len(problems))]) if len(problems) else \
            np.zeros((0, problems.candidates.shape[2]), dtype=np.int64)
        choice = _compatible_candidate(pins, idx, problems.candidates.astype(np.int8))
        return np.maximum(choice, 0).astype(np.int64)

    def plan_act(self, tapes, t):
        horizon, candidates, bonus = self._planner()
        mask, values = pins_to_bits(self.pins)
        return _plan_consistent(pack(tapes), mask, values, self.goal_words, self.planner_keys,
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


class LearnedModelTester(TesterBase):
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
        if not context.family.elementary:
            raise ValueError(f"a learned world tester reads binary tapes and is defined for the elementary family, "
                             f"not {context.family.describe()}")
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


def supports_family(tester_factory, family: RuleFamily) -> bool:
    """Whether a world tester answers the world test of `family` (the elementary family: every tester; another
    family: the built-in chance, true-rule and exact-reasoning testers, or a factory with `any_rule_family`)."""
    return family.elementary or tester_factory in ANY_FAMILY_TESTERS or \
        bool(getattr(tester_factory, "any_rule_family", False))


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


# the built-in testers that answer prediction and detection in any rule family (planning: the elementary one)
ANY_FAMILY_TESTERS = (chance_tester, true_rule_tester, random_exploration_tester, active_exploration_tester)
