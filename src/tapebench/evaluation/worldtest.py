"""The world-test runner (docs/protocol.md#world-test): the interaction phase, then each task, scored per problem.

For every side of the split and every task (each prediction length a task of its own), the runner builds a fresh
world tester (`Method.worldtest`), plays the interaction phase of `budget` steps on the rows' hidden rules, then
poses the task's problems (`episodes.worldtest`, the same for every method and budget) and scores the answers:

* prediction: 1 if the chosen candidate is the right one, else 0;
* planning: 1 if the tape equals the goal within the horizon (the row stops there), else 0; the final
  distance (fraction of wrong cells) beside it;
* detection: `episodes.worldtest.detection_score` of the first reported step.

Each task starts from the same interaction (the rows' streams do not depend on the task), so knowledge gathered
while answering one task never reaches another.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tapebench.episodes.worldtest import (WorldTestRows, detection_problems, detection_score, fresh_tapes,
                                          planning_problems, prediction_problems, transition, worldtest_rows)
from tapebench.methods.worldtest import (WorldTestBatch, WorldTestContext, WorldTester, reset_action,
                                         supports_family)
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.schemas import WORLDTEST_COLUMNS
from tapebench.validation import check_integer
from tapebench.vocabulary import DETECTION_TASK, PLANNING_TASK, PREDICTION_CANDIDATES, PREDICTION_TASK, WORLDTEST_TASKS

MAX_BUDGET = 4096
INTERACTION_STARTS = ("random", "zeros")   # the interaction phase's first tape: a fresh random tape, or 0...0


@dataclass(frozen=True)
class WorldTestSettings:
    """The task parameters of the world test (config `studies.worldtest`, docs/protocol.md#world-test)."""

    tasks: tuple[str, ...] = WORLDTEST_TASKS
    problems_per_rule: int = 2
    prediction_lengths: tuple[int, ...] = (1,)
    masked_cells: int = 8
    planning_horizon: int = 16
    goal_steps: int = 8
    detection_length: int = 4
    planner_horizon: int = 8
    planner_candidates: int = 128
    problem_seed: int = 0
    interaction_start: str = "zeros"


    def __post_init__(self):
        tasks = tuple(self.tasks)
        if not tasks or any(t not in WORLDTEST_TASKS for t in tasks) or len(set(tasks)) != len(tasks):
            raise ValueError(f"world test tasks must be distinct names among {list(WORLDTEST_TASKS)}, got {list(tasks)}")
        object.__setattr__(self, "tasks", tasks)
        lengths = tuple(int(check_integer(x, "prediction length", minimum=1, maximum=64))
                        for x in self.prediction_lengths)
        if not lengths or len(set(lengths)) != len(lengths):
            raise ValueError(f"prediction lengths must be distinct integers 1..64, got {list(self.prediction_lengths)}")
        object.__setattr__(self, "prediction_lengths", lengths)
        check_integer(self.problems_per_rule, "problems_per_rule", minimum=1, maximum=10_000)
        check_integer(self.masked_cells, "masked_cells", minimum=1, maximum=64)
        check_integer(self.planning_horizon, "planning horizon", minimum=1, maximum=256)
        check_integer(self.goal_steps, "planning goal_steps", minimum=1, maximum=self.planning_horizon)
        check_integer(self.detection_length, "detection length", minimum=1, maximum=256)
        check_integer(self.planner_horizon, "planner horizon", minimum=1, maximum=256)
        check_integer(self.planner_candidates, "planner candidates", minimum=1, maximum=65_536)
        check_integer(self.problem_seed, "problem_seed", minimum=0)
        if self.interaction_start not in INTERACTION_STARTS:
            raise ValueError(f"interaction_start must be one of {list(INTERACTION_STARTS)}, got "
                             f"{self.interaction_start!r}")

    @classmethod
    def from_config(cls, section: dict) -> "WorldTestSettings":
        """From the config's `studies.worldtest` section (methods, seeds and budgets are the pipeline's; ignored)."""
        section = dict(section or {})
        prediction, planning = section.get("prediction", {}), section.get("planning", {})
        detection, planner = section.get("detection", {}), section.get("planner", {})
        fields = {
            "tasks": section.get("tasks"), "problems_per_rule": section.get("problems_per_rule"),
            "prediction_lengths": prediction.get("lengths"), "masked_cells": prediction.get("masked_cells"),
            "planning_horizon": planning.get("horizon"), "goal_steps": planning.get("goal_steps"),
            "detection_length": detection.get("length"), "planner_horizon": planner.get("horizon"),
            "planner_candidates": planner.get("candidates"), "problem_seed": section.get("problem_seed"),
            "interaction_start": section.get("interaction_start"),
        }
        return cls(**{k: v for k, v in fields.items() if v is not None})

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _check_actions(actions, n: int, high: int, what: str) -> np.ndarray:
    actions = np.asarray(actions)
    if actions.shape != (n,) or not np.issubdtype(actions.dtype, np.integer):
        raise ValueError(f"a world tester's {what} must be ({n},) integers, got {actions.dtype} {actions.shape}")
    if n and (actions.min() < 0 or actions.max() > high):
        raise ValueError(f"a world tester's {what} must be in 0..{high}, got values {actions.min()}..{actions.max()}")
    return actions.astype(np.int64)


def _check_flags(flags, n: int, t: int) -> np.ndarray:
    """A detection step's reports: (n,) booleans (or integers 0 / 1), one per row."""
    flags = np.asarray(flags)
    if flags.shape != (n,) or not (flags.dtype == np.bool_ or np.issubdtype(flags.dtype, np.integer)):
        raise ValueError(f"a world tester's detection reports must be ({n},) booleans, got {flags.dtype} "
                         f"{flags.shape} at step {t}")
    if flags.dtype != np.bool_ and n and not np.isin(flags, (0, 1)).all():
        bad = flags[~np.isin(flags, (0, 1))]
        raise ValueError(f"a world tester's detection reports must be booleans (or 0 / 1), got {bad[0]} at step {t}")
    return flags.astype(bool)


TESTER_METHODS = tuple(name for name in WorldTester.__dict__ if not name.startswith("_"))


def _tester(method, config, context):
    """The method's world tester for one task, checked to be one (every method of `WorldTester`)."""
    tester = method.worldtest(config, context)
    missing = [name for name in TESTER_METHODS if not callable(getattr(tester, name, None))]
    if missing:
        raise ValueError(f"its worldtest returned {type(tester).__name__}, not a world tester: it lacks {missing} "
                         f"(methods/worldtest.py WorldTester)")
    return tester


def interact(tester, rows: WorldTestRows, budget: int, reveal_rules: bool, start: str = "random") -> None:
    """The interaction phase: `budget` steps on each row's hidden rule, no reward, resets allowed. It begins on a
    fresh random tape (`start` "random") or on the all-zero tape ("zeros"); a reset always gives a random one."""
    budget = check_integer(budget, "world test budget", minimum=0, maximum=MAX_BUDGET)
    L, n, family = rows.L, len(rows), rows.family
    tester.explore_begin(WorldTestBatch(L=L, budget=budget, keys=rows.keys.copy(),
                                        rules=rows.rules.copy() if reveal_rules else None))
    tapes = fresh_tapes(rows.keys, 0, L, family.k) if start == "random" else np.zeros((n, L), dtype=np.uint8)
    resets = np.zeros(n, dtype=np.int64)
    for step in range(budget):
        actions = _check_actions(tester.explore_act(tapes.copy(), step), n, reset_action(L), "exploration actions")
        is_reset = actions == reset_action(L)
        following = transition(tapes, np.where(is_reset, 0, actions), rows.rules, family)
        if is_reset.any():
            resets[is_reset] += 1
            following[is_reset] = fresh_tapes(rows.keys[is_reset], resets[is_reset], L, family.k)
        tester.explore_observe(tapes.copy(), actions.copy(), following.copy())
        tapes = following


def _records(rows: WorldTestRows, task: str, length: int, score, success=None, final_dist=None, delay=None):
    n = len(rows)
    nan = np.full(n, np.nan)
    return pd.DataFrame({
        "family": rows.family.name, "side": rows.side, "rule": rows.rules, "problem": rows.problems, "task": task,
        "length": np.full(n, int(length), dtype=np.int64), "score": np.asarray(score, dtype=np.float64),
        "success": nan if success is None else np.asarray(success, dtype=np.float64),
        "final_dist": nan if final_dist is None else np.asarray(final_dist, dtype=np.float64),
        "delay": nan if delay is None else np.asarray(delay, dtype=np.float64),
    })


def score_prediction(tester, rows, T: int, masked_cells: int) -> pd.DataFrame:
    problems, key = prediction_problems(rows, T, masked_cells)
    choice = _check_actions(tester.predict(problems), len(rows), PREDICTION_CANDIDATES - 1, "prediction answers")
    return _records(rows, PREDICTION_TASK, T, choice == key.answers)


def planning_rows(rows: WorldTestRows, horizon: int, goal_steps: int) -> WorldTestRows:
    """The rows that have a planning problem (a rule that reaches only 0...0 has none)."""
    return rows.subset(planning_problems(rows, horizon, goal_steps)[1].valid)


def score_planning(tester, rows, horizon: int, goal_steps: int) -> pd.DataFrame:
    problems, _ = planning_problems(rows, horizon, goal_steps)
    L, n = rows.L, len(rows)
    tester.plan_begin(problems)
    tapes = problems.starts.copy()
    reached = np.zeros(n, dtype=bool)
    for t in range(horizon):
        actions = _check_actions(tester.plan_act(tapes.copy(), t), n, L - 1, "planning actions")
        following = transition(tapes, actions, rows.rules, rows.family)
        following[reached] = tapes[reached]   # a row that reached its goal stays there
        tester.plan_observe(tapes.copy(), actions.copy(), following.copy())
        tapes = following
        reached |= np.all(tapes == problems.goals, axis=1)
        if reached.all():
            break
    final_dist = np.mean(tapes != problems.goals, axis=1)
    return _records(rows, PLANNING_TASK, horizon, reached, success=reached, final_dist=final_dist)


def score_detection(tester, rows, T: int) -> pd.DataFrame:
    problems, key = detection_problems(rows, T)
    n = len(rows)
    tester.detect_begin(problems)
    report = np.zeros(n, dtype=np.int64)
    for t in range(1, T + 1):
        flags = _check_flags(tester.detect_step(t, key.tapes[:, t - 1].copy(), problems.actions[:, t - 1].copy(),
                                                key.tapes[:, t].copy()), n, t)
        report = np.where((report == 0) & flags, t, report)
    delay = np.where(report > 0, report - key.earliest, np.nan)
    return _records(rows, DETECTION_TASK, T, detection_score(report, key.earliest), delay=delay)


def check_family(method, settings: WorldTestSettings, family: RuleFamily) -> None:
    """The world test of a family other than the elementary one: prediction and detection, by methods whose
    tester supports the family (`methods.worldtest.supports_family`); planning is elementary only."""
    if family.elementary:
        return
    if PLANNING_TASK in settings.tasks:
        raise ValueError(f"world-test planning is defined for the elementary family (exact reasoning plans over the "
                         f"enumerated consistent rules), not {family.describe()}; use tasks "
                         f"{[t for t in settings.tasks if t != PLANNING_TASK]}")
    if not supports_family(method.worldtest, family):
        raise ValueError(f"method {method.id!r} answers the world test of the elementary family only, not "
                         f"{family.describe()}")


def run_worldtest(method, config, settings: WorldTestSettings, *, sides: dict, L: int, H: int, seed: int,
                   budget: int, split_name: str = "", split_key: int = 0, agent=None, success_bonus: float = 1.0,
                   device="cpu", log=None, family: RuleFamily = ELEMENTARY) -> pd.DataFrame:
    """Per-problem records (columns `schemas.WORLDTEST_COLUMNS`) of one method, seed and budget.

    `sides` maps a side name to its rules (of `family`); `agent` is the trained agent of a method that trains."""
    if method.worldtest is None:
        raise ValueError(f"method {method.id!r} does not take part in the world test (its registry entry has no "
                         f"worldtest)")
    check_family(method, settings, family)
    if method.trains and agent is None:
        raise ValueError(f"method {method.id!r} trains: its world test needs the trained agent (--run)")
    context = WorldTestContext(L=int(L), H=int(H), seed=int(seed), planner_horizon=settings.planner_horizon,
                               planner_candidates=settings.planner_candidates, success_bonus=float(success_bonus),
                               agent=agent, device=device, family=family)
    frames = []
    for side, rules in sides.items():
        rows = worldtest_rows(rules, settings.problems_per_rule, L, side=side, seed=seed,
                               problem_seed=settings.problem_seed, split_key=split_key, family=family)
        tasks = []
        if PREDICTION_TASK in settings.tasks:
            tasks += [(PREDICTION_TASK, T) for T in settings.prediction_lengths]
        if PLANNING_TASK in settings.tasks:
            tasks.append((PLANNING_TASK, settings.planning_horizon))
        if DETECTION_TASK in settings.tasks:
            tasks.append((DETECTION_TASK, settings.detection_length))
        for task, length in tasks:
            task_rows = planning_rows(rows, length, settings.goal_steps) if task == PLANNING_TASK else rows
            if len(task_rows) == 0:
                continue
            try:
                tester = _tester(method, config, context)
                interact(tester, task_rows, budget, method.sees_true_rule, settings.interaction_start)
                if task == PREDICTION_TASK:
                    frame = score_prediction(tester, task_rows, length, settings.masked_cells)
                elif task == PLANNING_TASK:
                    frame = score_planning(tester, task_rows, length, settings.goal_steps)
                else:
                    frame = score_detection(tester, task_rows, length)
            except Exception as exc:  # a plug-in's tester may raise anything: name the method and the task
                what = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                raise ValueError(f"method {method.id!r}, world test {side} {task} (length {length}): {what}") \
                    from exc
            frames.append(frame)
            if log is not None:
                log(f"{method.id} seed {seed} B={budget} {side} {task} (length {length}): mean score "
                    f"{frame['score'].mean():.3f} over {len(frame)} problems")
    table = pd.concat(frames, ignore_index=True)
    table.insert(0, "split", split_name)
    table.insert(0, "budget", int(budget))
    table.insert(0, "seed", int(seed))
    table.insert(0, "agent", method.id)
    return table[list(WORLDTEST_COLUMNS)].astype(WORLDTEST_COLUMNS)
