"""The world test's problems (docs/protocol.md#world-test): drawn once per (seed, side, rule, problem, task) from
common random numbers, so every method answers the same problems, whatever its interaction budget.

A *row* is one hidden rule z (from one side of a split) and one problem index j. The row's identity
(problem seed, world-test seed, split key, side, rule, j) fixes

* its key (`WorldTestRows.keys`): the methods' per-row randomness and the interaction phase's fresh tapes
  (`fresh_tapes`), the same for every task;
* one problem of each task, each from its own SeedSequence stream:

  - **prediction** (length T): a random tape s0 and T random actions; the tapes s0..s_{T-1} are shown, the
    masked cells of s_T are to be chosen among `PREDICTION_CANDIDATES` candidates. The right one is s_T's
    masked cells; the distractors are the masked cells other rules z' would produce from the last shown step
    (s_{T-1}, a_T), in a random order of the 255 other rules, keeping those distinct from the right answer and
    from each other; if fewer than five such exist, random patterns distinct from all fill up. The six are
    shuffled. So exactly one candidate is right by construction.
  - **planning**: a random start s0 and a goal g reached from s0 by the hidden rule under `goal_steps` or fewer
    random actions (k uniform in 1..goal_steps), redrawn while g is s0 or the all-zero tape. Every goal is
    reachable within k <= horizon steps by construction (its witness actions are kept). A rule that reaches no
    such tape in `GOAL_DRAWS` draws (rule 0 maps every tape to 0...0) has no planning problem: the row is
    left out of planning (`PlanningKey.valid`).
  - **detection** (length T): a random start, T random actions, a hidden switch step k in 1..T and another
    rule z' != z: step t uses z before k and z' from k on. The earliest detectable step is the first t >= k
    whose tape differs from F_z(s_{t-1} XOR e_{a_t}); problems with none within T are redrawn.

Rows carry their rule family (`rule_family.RuleFamily`, k colours, radius r; the elementary family by default):
tapes are uint8 (N, L) arrays of cells 0..k-1, an action increments a cell mod k (a flip for k = 2), and actions
are int64 cell indices (L <= 64). The elementary family runs on the bit-packed kernel and draws exactly what it
always drew; another family runs on the table kernel, and its distractor rules (prediction candidates, the
detection switch) are uniformly random other rules of the family.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numba as nb
import numpy as np

from tapebench.ca import table_kernel
from tapebench.ca.packed import pack, step_word, step_words_rules, unpack
from tapebench.episodes.streams import check_side, mix64_array, side_code, step_keys
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.validation import check_integer, check_length
from tapebench.vocabulary import DETECTION_TASK, PLANNING_TASK, PREDICTION_CANDIDATES, PREDICTION_TASK

TASK_CODES = {PREDICTION_TASK: 0, PLANNING_TASK: 1, DETECTION_TASK: 2}
FRESH_TAPE_SALT = 0x5245534554   # the interaction phase's fresh tapes (a stream of the row key)
FRESH_CELL_SALT = 0x43454C4C     # a fresh tape's cells for k > 2 (one word per cell)
DISTRACTOR_DRAWS = 256           # random other rules tried for prediction distractors (k > 2 or r > 1)
MAX_REDRAWS = 10_000             # draws of a detection problem before giving up (never reached)
GOAL_DRAWS = 256                 # draws of a planning goal before the row has none (rules reaching only 0...0)
DETECTION_DECAY = 0.5            # detection score per step of delay after the earliest detectable step


@dataclass(frozen=True)
class WorldTestRows:
    """The rows of one world-test job side: hidden rule and problem index, rule-major."""

    L: int
    side: str
    rules: np.ndarray      # (N,) int64 hidden rules
    problems: np.ndarray   # (N,) int64 problem index j within the rule
    keys: np.ndarray       # (N,) uint64 row identities (methods' per-row randomness, fresh tapes)
    entropy: tuple         # (problem seed, world-test seed, split key): the rest of every row's identity
    family: RuleFamily = field(default=ELEMENTARY)   # the rules' family (k colours, radius r)

    def __len__(self) -> int:
        return len(self.rules)

    def subset(self, rows) -> "WorldTestRows":
        return WorldTestRows(self.L, self.side, self.rules[rows], self.problems[rows], self.keys[rows], self.entropy,
                             self.family)

    def identity(self, row: int, task: str, length: int) -> list[int]:
        return [*self.entropy, side_code(self.side), int(self.rules[row]), int(self.problems[row]),
                TASK_CODES[task], int(length)]


def worldtest_rows(rules, problems_per_rule: int, L: int, *, side: str, seed: int, problem_seed: int = 0,
                    split_key: int = 0, family: RuleFamily = ELEMENTARY) -> WorldTestRows:
    """The rows of `rules` x `problems_per_rule` problems on one side, for world-test seed `seed`."""
    L = check_length(L)
    if L > 64:
        raise ValueError(f"the world test needs L <= 64, got L={L}")
    check_integer(problems_per_rule, "world test problems_per_rule", minimum=1)
    check_integer(seed, "world test seed", minimum=0)
    check_integer(problem_seed, "world test problem_seed", minimum=0)
    if not family.fits_int64:
        raise ValueError(f"the world test stores rules as int64 and supports the families whose rule numbers fit "
                         f"64 bits (k = 2 with r = 1, 2; k = 3, r = 1), not {family.describe()}")
    rules = np.asarray(family.check_rules(rules) if np.size(rules) else rules, dtype=np.int64)
    if rules.ndim != 1:
        raise ValueError(f"world-test rules must be a list of rule numbers, got shape {rules.shape}")
    side = check_side(side)
    rule_col = np.repeat(rules, problems_per_rule)
    problem_col = np.tile(np.arange(problems_per_rule, dtype=np.int64), len(rules))
    entropy = (int(problem_seed), int(seed), int(split_key))
    keys = np.array([np.random.SeedSequence([*entropy, side_code(side), int(z), int(j)], spawn_key=(7,))
                     .generate_state(1, np.uint64)[0] for z, j in zip(rule_col, problem_col)], dtype=np.uint64)
    return WorldTestRows(L, side, rule_col, problem_col, keys, entropy, family)


def fresh_tapes(keys: np.ndarray, n, L: int, k: int = 2) -> np.ndarray:
    """(N, L) uint8: the n-th fresh random tape of each row, cells uniform over 0..k-1 (n = 0: the interaction
    phase's first tape; the j-th reset gives tape j). `n` is a scalar or an (N,) array. A pure function of
    (row key, n)."""
    counters = np.broadcast_to(np.asarray(n, dtype=np.uint64), np.shape(keys))
    with np.errstate(over="ignore"):
        words = mix64_array(np.asarray(keys, dtype=np.uint64) ^ mix64_array(counters + np.uint64(FRESH_TAPE_SALT)))
        if k == 2:
            return unpack(words, L)
        cells = mix64_array(words[:, None] ^ mix64_array(np.arange(L, dtype=np.uint64) + np.uint64(FRESH_CELL_SALT)))
    return ((cells >> np.uint64(32)) * np.uint64(k) >> np.uint64(32)).astype(np.uint8)


@lru_cache(maxsize=65_536)
def _table(family: RuleFamily, rule: int) -> np.ndarray:
    return family.table(rule)


def rule_tables(rules, family: RuleFamily) -> tuple[np.ndarray, np.ndarray]:
    """(tables (n_distinct, k^(2r+1)) uint8, index (N,) int64): the table of each row's rule."""
    distinct, index = np.unique(np.asarray(rules, dtype=np.int64), return_inverse=True)
    tables = np.stack([_table(family, int(z)) for z in distinct]) if len(distinct) else \
        np.zeros((0, family.neighbourhoods), dtype=np.uint8)
    return tables, index.astype(np.int64).reshape(-1)


def act(tapes: np.ndarray, actions: np.ndarray, k: int) -> np.ndarray:
    """(N, L) uint8: the post-action tapes (cell a_i of row i incremented mod k; a flip for k = 2)."""
    out = np.array(tapes, dtype=np.uint8, copy=True)
    rows = np.arange(len(out))
    actions = np.asarray(actions, dtype=np.int64)
    out[rows, actions] = (out[rows, actions] + 1) % k
    return out


def random_actions(keys: np.ndarray, t: int, salt: int, L: int) -> np.ndarray:
    """(N,) int64 uniform cells of step t under a method's salt (its seed): counter-based, per row."""
    words = step_keys(np.asarray(keys, dtype=np.uint64), t, salt)
    return ((words >> np.uint64(32)) * np.uint64(L) >> np.uint64(32)).astype(np.int64)


def transition(tapes: np.ndarray, actions: np.ndarray, rules: np.ndarray, family: RuleFamily = ELEMENTARY) \
        -> np.ndarray:
    """(N, L) uint8: F_z(s + e_a mod k) per row (the environment's step: for k = 2, F_z(s XOR e_a))."""
    L = tapes.shape[1]
    if family.elementary:
        words = pack(tapes) ^ (np.uint64(1) << np.asarray(actions, dtype=np.uint64))
        return unpack(step_words_rules(words, np.asarray(rules, dtype=np.int64), L), L)
    tables, index = rule_tables(rules, family)
    return table_kernel.transition_nb(np.ascontiguousarray(tapes, dtype=np.uint8),
                                      np.asarray(actions, dtype=np.int64), tables, index, family.k, family.r)


@nb.njit(cache=True)
def _all_rule_steps(word, L):
    out = np.empty(256, dtype=np.uint64)
    for z in range(256):
        out[z] = step_word(word, z, L)
    return out


# --- prediction ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PredictionProblems:
    """What a method sees of N prediction problems of length T (all rows the same T)."""

    T: int
    tapes: np.ndarray        # (N, T, L) uint8: s_0 .. s_{T-1}, the shown tapes
    actions: np.ndarray      # (N, T) int64: a_1 .. a_T (s_t = F_z(s_{t-1} XOR e_{a_t}))
    mask: np.ndarray         # (N, L) bool: the masked cells of s_T
    candidates: np.ndarray   # (N, PREDICTION_CANDIDATES, M) uint8: candidate values of the masked cells, in cell order

    def __len__(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class PredictionKey:
    """The hidden part: the right candidate and the true final tape."""

    answers: np.ndarray      # (N,) int64
    final: np.ndarray        # (N, L) uint8: s_T


def _distractors(rows: WorldTestRows, i: int, rng, last: np.ndarray, action: int, cells: np.ndarray,
                 right: np.ndarray) -> list:
    """Row i's prediction candidates: the right answer first, then the masked cells other rules produce from the
    last shown step, distinct from the right one and each other; random patterns fill up."""
    family, L, z = rows.family, rows.L, int(rows.rules[i])
    chosen = [right]
    seen = {right.tobytes()}
    if family.elementary:   # every other rule, in a random order
        post = pack(last)[0] ^ (np.uint64(1) << np.uint64(action))
        others = unpack(_all_rule_steps(post, L), L)[:, cells]
        tries = [others[z_other] for z_other in rng.permutation(256) if z_other != z]
    else:                   # uniformly random rules of the family (a tiny chance of z itself, skipped)
        own = _table(family, z)
        tables = rng.integers(0, family.k, (DISTRACTOR_DRAWS, family.neighbourhoods), dtype=np.uint8)
        tables = tables[np.any(tables != own, axis=1)]
        post = act(last[None], np.array([action]), family.k)[0]
        idx = neighbourhood_indices(post[None], family)[0, cells]
        tries = list(tables[:, idx])
    for other in tries:
        if len(chosen) == PREDICTION_CANDIDATES:
            break
        if other.tobytes() not in seen:
            chosen.append(other)
            seen.add(other.tobytes())
    while len(chosen) < PREDICTION_CANDIDATES:   # too few distinct alternatives: random patterns fill up
        pattern = rng.integers(0, family.k, len(cells), dtype=np.uint8)
        if pattern.tobytes() not in seen:
            chosen.append(pattern)
            seen.add(pattern.tobytes())
    return chosen


def neighbourhood_indices(tapes: np.ndarray, family: RuleFamily) -> np.ndarray:
    """(N, L) int64: the neighbourhood index of every cell (periodic tape, `RuleFamily` numbering)."""
    tapes = np.asarray(tapes, dtype=np.int64)
    idx = np.zeros(tapes.shape, dtype=np.int64)
    for j in range(-family.r, family.r + 1):
        idx = idx * family.k + np.roll(tapes, -j, axis=1)
    return idx


def prediction_problems(rows: WorldTestRows, T: int, masked_cells: int) -> tuple[PredictionProblems, PredictionKey]:
    T = check_integer(T, "prediction length", minimum=1)
    L, family = rows.L, rows.family
    M = check_integer(masked_cells, "masked_cells", minimum=1, maximum=L)
    n = len(rows)
    tapes = np.zeros((n, T + 1, L), dtype=np.uint8)
    actions = np.zeros((n, T), dtype=np.int64)
    masks = np.zeros((n, L), dtype=bool)
    candidates = np.zeros((n, PREDICTION_CANDIDATES, M), dtype=np.uint8)
    answers = np.zeros(n, dtype=np.int64)
    for i in range(n):
        rng = np.random.default_rng(np.random.SeedSequence(rows.identity(i, PREDICTION_TASK, T)))
        z = int(rows.rules[i])
        tapes[i, 0] = rng.integers(0, family.k, L, dtype=np.uint8)
        actions[i] = rng.integers(0, L, T)
        for t in range(T):
            tapes[i, t + 1] = transition(tapes[i, t][None], actions[i, t:t + 1], np.array([z]), family)[0]
        cells = np.sort(rng.choice(L, M, replace=False))
        masks[i, cells] = True
        chosen = _distractors(rows, i, rng, tapes[i, T - 1], int(actions[i, T - 1]), cells, tapes[i, T, cells])
        order = rng.permutation(PREDICTION_CANDIDATES)
        candidates[i] = np.stack(chosen)[order]
        answers[i] = int(np.flatnonzero(order == 0)[0])
    problems = PredictionProblems(T, tapes[:, :T].copy(), actions, masks, candidates)
    return problems, PredictionKey(answers, tapes[:, T].copy())


# --- planning -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanningProblems:
    """What a method sees of N planning problems: start tapes and goals; it has `horizon` steps."""

    horizon: int
    starts: np.ndarray       # (N, L) uint8
    goals: np.ndarray        # (N, L) uint8

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True)
class PlanningKey:
    witnesses: list          # per row: the action sequence (length 1..goal_steps) that reaches the goal
    valid: np.ndarray        # (N,) bool: the row has a goal (its rule reaches a tape other than 0...0)


def planning_problems(rows: WorldTestRows, horizon: int, goal_steps: int) -> tuple[PlanningProblems, PlanningKey]:
    horizon = check_integer(horizon, "planning horizon", minimum=1)
    goal_steps = check_integer(goal_steps, "planning goal_steps", minimum=1, maximum=horizon)
    L, n, family = rows.L, len(rows), rows.family
    starts = np.zeros((n, L), dtype=np.uint8)
    goals = np.zeros((n, L), dtype=np.uint8)
    witnesses = []
    valid = np.zeros(n, dtype=bool)
    for i in range(n):
        rng = np.random.default_rng(np.random.SeedSequence(rows.identity(i, PLANNING_TASK, horizon)))
        starts[i], goals[i], acts, valid[i] = reachable_goal(rng, int(rows.rules[i]), L, goal_steps, family=family)
        witnesses.append(acts)
    return PlanningProblems(horizon, starts, goals), PlanningKey(witnesses, valid)


def reachable_goal(rng: np.random.Generator, rule: int, L: int, goal_steps: int, start=None,
                   family: RuleFamily = ELEMENTARY):
    """A goal `rule` (of `family`) reaches from a start in k random steps (k uniform in 1..goal_steps; a step is a
    uniformly random cell flipped, then the rule's update), redrawn while it is the start or the all-zero tape.

    Without `start` every draw draws its start first (the world test's planning problems); with `start` ((L,) uint8)
    only k and the actions are drawn (the multi-goal protocol's episodes, docs/protocol.md#multi-goal).
    Returns (start, goal, actions, found): `actions` (int64) lead from start to goal under the rule, so the goal is
    reachable by construction; found is False when no draw in `GOAL_DRAWS` gave such a goal (rule 0 reaches only
    0...0), and the last draw is returned."""
    z = np.array([rule], dtype=np.int64)
    for _ in range(GOAL_DRAWS):
        first = rng.integers(0, family.k, L, dtype=np.uint8) if start is None else start
        k = int(rng.integers(1, goal_steps + 1))
        acts = rng.integers(0, L, k)
        tape = first
        for a in acts:
            tape = transition(tape[None], np.array([a]), z, family)[0]
        if tape.any() and not np.array_equal(tape, first):
            return first, tape, acts.astype(np.int64), True
    return first, tape, acts.astype(np.int64), False


# --- detection ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DetectionProblems:
    """What a method is told before watching N trajectories of T steps: the start tapes and the actions."""

    T: int
    starts: np.ndarray       # (N, L) uint8: s_0
    actions: np.ndarray      # (N, T) int64: a_1 .. a_T

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True)
class DetectionKey:
    tapes: np.ndarray        # (N, T + 1, L) uint8: the trajectory s_0 .. s_T, shown one step at a time
    switch: np.ndarray       # (N,) int64: the first step played with the other rule
    other: np.ndarray        # (N,) int64: the rule played from the switch on
    earliest: np.ndarray     # (N,) int64: the earliest detectable step (>= switch)


def earliest_detectable(tapes: np.ndarray, actions: np.ndarray, rule: int, family: RuleFamily = ELEMENTARY) -> int:
    """The first step t (1-based) whose tape differs from F_rule(s_{t-1} + e_{a_t}); 0 if none."""
    T = len(actions)
    predicted = transition(tapes[:T], actions, np.full(T, rule), family)
    differs = np.any(predicted != tapes[1:T + 1], axis=1)
    return int(np.argmax(differs)) + 1 if differs.any() else 0


def _other_rule(family: RuleFamily, z: int, rng) -> int:
    """A rule of the family other than z, uniformly (the elementary family: z + 1..255 mod 256)."""
    if family.elementary:
        return int((z + rng.integers(1, 256)) % 256)
    while True:
        other = family.number(rng.integers(0, family.k, family.neighbourhoods, dtype=np.uint8))
        if other != z:
            return other


def detection_problems(rows: WorldTestRows, T: int) -> tuple[DetectionProblems, DetectionKey]:
    T = check_integer(T, "detection length", minimum=1)
    L, n, family = rows.L, len(rows), rows.family
    tapes = np.zeros((n, T + 1, L), dtype=np.uint8)
    actions = np.zeros((n, T), dtype=np.int64)
    switch, other, earliest = (np.zeros(n, dtype=np.int64) for _ in range(3))
    for i in range(n):
        rng = np.random.default_rng(np.random.SeedSequence(rows.identity(i, DETECTION_TASK, T)))
        z = int(rows.rules[i])
        for _ in range(MAX_REDRAWS):
            tapes[i, 0] = rng.integers(0, family.k, L, dtype=np.uint8)
            actions[i] = rng.integers(0, L, T)
            switch[i] = int(rng.integers(1, T + 1))
            other[i] = _other_rule(family, z, rng)
            for t in range(1, T + 1):
                rule = z if t < switch[i] else other[i]
                tapes[i, t] = transition(tapes[i, t - 1][None], actions[i, t - 1:t], np.array([rule]), family)[0]
            earliest[i] = earliest_detectable(tapes[i], actions[i], z, family)
            if earliest[i] > 0:
                break
        else:
            raise RuntimeError(f"no detectable switch for rule {z} after {MAX_REDRAWS} draws")
    return DetectionProblems(T, tapes[:, 0].copy(), actions), DetectionKey(tapes, switch, other, earliest)


def detection_score(report: np.ndarray, earliest: np.ndarray) -> np.ndarray:
    """1 at the earliest detectable step, DETECTION_DECAY ** delay after it, 0 before it or without a report
    (report 0)."""
    report, earliest = np.asarray(report, dtype=np.int64), np.asarray(earliest, dtype=np.int64)
    delay = (report - earliest).astype(np.float64)
    return np.where((report > 0) & (delay >= 0), DETECTION_DECAY ** np.maximum(delay, 0.0), 0.0)
