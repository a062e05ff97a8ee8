"""The few-shot adaptation study (docs/protocol.md#few-shot): success on fresh episodes of a rule after the method has
played k reward-bearing episodes of that rule.

For each side of the split (ID: training rules, OOD: held-out rules) and each study rule z of that side:

* the test episodes are the evaluation's own episodes of z (`evaluation.protocol.protocol_episodes`: the evaluation
  seed, split key, side, rule and episode index), so k = 0 is the method's zero-shot evaluation on those episodes;
* the adaptation episodes are episodes 0..k-1 of z drawn from a disjoint stream (`episodes.streams.adaptation_seed`
  of the evaluation seed), the same for every method, seed and k (k = 4 plays the first four of k = 8's).

How a method uses them (`adaptation_mode`):

* "context" — its evaluation policy infers the rule in context and has `carry(batch)` (methods.contract): every test
  row plays the k adaptation episodes of its rule with `begin` for the first and `carry` for the next, then its test
  episode with `carry` (from a copy of the policy, so the adaptation continues to the next k), so the hidden state (RL2-A2C), the context of transitions (PEARL-DQN), the posterior (the
  Bayes filters) or the rule-table bits (identify-then-plan) it gathered carry into the test episode;
* "gradient" — a method that trains adapts by its own training update: the final checkpoint's policy weights in an
  agent built with the trained hyperparameters, the method module's `FEWSHOT_ADAPTATION` overrides (its default
  recipe), the study's `adapt` overrides and num_envs = 1, a fresh optimiser; it plays the adaptation episodes one
  after another exactly as the training loop drives it (`act` exploring, `observe`, `update` after every step) and
  the test episodes with its greedy policy. Its own draws come from torch seeded per seed, side and rule
  (`adaptation_torch_seed`), so the k-shot agent is the longer adaptation's agent after k episodes;
* "none" — a method that never uses what it learns of the rule (`Method.rule_agnostic`: the live-cell rows, the
  prior-only planner, the random floor) or is told it (`Method.sees_true_rule`: the true-dynamics MPC, the exact
  optimum): what it plays does not depend on k; its test episodes are played once and reported at every k.

Any other method without `carry` or a recipe is refused.
"""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from tapebench import defaults
from tapebench.episodes.sets import EpisodeSet, episode_set
from tapebench.episodes.streams import adaptation_seed, adaptation_torch_seed
from tapebench.evaluation.evaluate import with_run_columns
from tapebench.evaluation.protocol import protocol_episodes
from tapebench.evaluation.runner import episode_frame, run_episodes
from tapebench.methods.contract import EnvSpec, greedy_policy
from tapebench.registry import Method, PolicyContext, build_config, check_rule_family
from tapebench.schemas import FEWSHOT_COLUMNS
from tapebench.vocabulary import SPLIT_SIDES

GRADIENT, CONTEXT, NONE = "gradient", "context", "none"
ADAPTATION_MODES = (GRADIENT, CONTEXT, NONE)
RECIPE_ATTRIBUTE = "FEWSHOT_ADAPTATION"   # a training method module's default gradient-adaptation overrides


@dataclass(frozen=True)
class FewShotSettings:
    """What a few-shot job plays: the shot counts k, how many rules per side, and the gradient recipe's overrides."""

    shots: tuple[int, ...] = defaults.FEWSHOT_SHOTS
    rules_per_side: int | None = defaults.FEWSHOT_RULES_PER_SIDE
    adapt: dict = field(default_factory=dict)

    def __post_init__(self):
        shots = list(self.shots)
        if not shots or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in shots):
            raise ValueError(f"few-shot shots must be a non-empty list of integers >= 0, got {self.shots!r}")
        if len(set(shots)) != len(shots):
            raise ValueError(f"few-shot shots must not repeat, got {self.shots!r}")
        n = self.rules_per_side
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"few-shot rules_per_side must be an integer >= 1 or null (every rule), got {n!r}")
        if not isinstance(self.adapt, dict):
            raise ValueError(f"few-shot adapt must be a mapping of hyperparameter overrides, got {self.adapt!r}")
        object.__setattr__(self, "shots", tuple(sorted(int(k) for k in shots)))

    @classmethod
    def from_config(cls, section: dict) -> "FewShotSettings":
        known = {"shots", "rules_per_side", "adapt"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown few-shot setting(s) {unknown}; allowed: {sorted(known)}")
        return cls(shots=tuple(section.get("shots", defaults.FEWSHOT_SHOTS)),
                   rules_per_side=section.get("rules_per_side", defaults.FEWSHOT_RULES_PER_SIDE),
                   adapt=dict(section.get("adapt") or {}))

    def as_dict(self) -> dict:
        return {"shots": list(self.shots), "rules_per_side": self.rules_per_side, "adapt": dict(self.adapt)}


def study_rules(rules, rules_per_side: int | None) -> list[int]:
    """The side's rules the study adapts to: all of them (None), else `rules_per_side` evenly spaced over the sorted
    rules (the first and the last among them)."""
    rules = sorted(int(z) for z in rules)
    if rules_per_side is None or rules_per_side >= len(rules):
        return rules
    picks = np.linspace(0, len(rules) - 1, int(rules_per_side)).round().astype(int)
    return [rules[i] for i in dict.fromkeys(picks.tolist())]


def gradient_recipe(method: Method) -> dict | None:
    """The method module's default gradient-adaptation overrides (`FEWSHOT_ADAPTATION`), or None without one."""
    if not method.trains:
        return None
    module = importlib.import_module(method.make_agent.__module__)
    recipe = getattr(module, RECIPE_ATTRIBUTE, None)
    return None if recipe is None else dict(recipe)


def adaptation_mode(method: Method, policy) -> str:
    """How `method` adapts (module docstring), given a fresh evaluation policy of it."""
    if method.rule_agnostic or method.sees_true_rule:
        return NONE
    if callable(getattr(policy, "carry", None)):
        return CONTEXT
    if method.trains and gradient_recipe(method) is not None:
        return GRADIENT
    how = (f"its module {method.make_agent.__module__} defines no {RECIPE_ATTRIBUTE} (gradient adaptation by its own "
           f"update)" if method.trains else "it does not train")
    raise ValueError(f"method {method.id!r} has no few-shot adaptation: its evaluation policy has no carry(batch) "
                     f"(in-context adaptation) and {how}; see docs/protocol.md#few-shot")


class _Carrying:
    """An evaluation policy whose first `begin` begins and every later one carries its context."""

    def __init__(self, policy):
        self.policy, self.started = policy, False

    def begin(self, batch) -> None:
        (self.policy.carry if self.started else self.policy.begin)(batch)
        self.started = True

    def act(self, obs):
        return self.policy.act(obs)

    def observe(self, *transition) -> None:
        self.policy.observe(*transition)


class _Learning:
    """A training agent driven as the training loop drives it: exploring `act`, `observe`, then `update` (with
    gradients) after every step."""

    def __init__(self, agent):
        self.agent = agent

    def begin(self, batch) -> None:
        pass

    def act(self, obs):
        return self.agent.act(obs)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.agent.observe(obs, actions, rewards, next_obs, terminated, truncated)
        with torch.enable_grad():
            self.agent.update()


@dataclass
class _Side:
    test: EpisodeSet          # the study rules' evaluation episodes
    adapt: EpisodeSet         # max(k) adaptation episodes per study rule, rule-major
    rules: list[int]
    types: dict[int, str]
    H: int
    goal: np.ndarray
    success_bonus: float

    def adaptation_rows(self, rules: np.ndarray, episode: int) -> EpisodeSet:
        """Adaptation episode `episode` of each rule in `rules` (one row per entry)."""
        position = {z: i for i, z in enumerate(self.rules)}
        per_rule = len(self.adapt) // len(self.rules)
        return self.adapt.subset(np.array([position[int(z)] * per_rule + episode for z in rules], dtype=np.int64))


def _sides(split, settings: FewShotSettings, *, L, H, episodes_per_rule, eval_seed, success_bonus, noise, goal_mode,
           goal_steps) -> list[_Side]:
    sides = []
    for side in SPLIT_SIDES:
        episodes, protocol, types = protocol_episodes(
            L=L, H=H, split=split, side=side, episodes_per_rule=episodes_per_rule, eval_seed=eval_seed,
            success_bonus=success_bonus, noise=noise, goal_mode=goal_mode, goal_steps=goal_steps)
        rules = study_rules(protocol.rules, settings.rules_per_side)
        test = episodes.subset(np.flatnonzero(np.isin(episodes.rules, rules)))
        adapt = episode_set(rules, max(1, max(settings.shots)), L, eval_seed=adaptation_seed(eval_seed),
                            key=episodes.key, side=side, goal=protocol.goal_tape(), family=episodes.family,
                            noise=noise, goal_mode=goal_mode, goal_steps=goal_steps)
        sides.append(_Side(test, adapt, rules, types, H, protocol.goal_tape(), float(success_bonus)))
    return sides


def _play(policy, episodes: EpisodeSet, side: _Side, method: Method, device) -> dict:
    return run_episodes(policy, episodes, side.H, goal=side.goal, success_bonus=side.success_bonus, device=device,
                        reveal_rules=method.sees_true_rule, by_rule=method.by_rule, who=f"method {method.id!r}")


def _frame(results: dict, episodes: EpisodeSet, side: _Side, split_name: str, shots: int, mode: str,
           method: Method, seed: int, checkpoint: int) -> pd.DataFrame:
    frame = with_run_columns(episode_frame(results, episodes, H=side.H, split=split_name, rule_types=side.types),
                             method.id, seed, checkpoint)
    frame.insert(3, "shots", int(shots))
    frame.insert(4, "adaptation", mode)
    return frame


def run_fewshot(method: Method, settings: FewShotSettings, *, split, seed: int, L: int, H: int,
                episodes_per_rule: int = defaults.EPISODES_PER_RULE, eval_seed: int = defaults.EVAL_SEED,
                success_bonus: float = defaults.SUCCESS_BONUS, noise: float = defaults.NOISE,
                goal_mode: str = defaults.GOAL, goal_steps: int = defaults.GOAL_STEPS, payload: dict | None = None,
                hyperparameters: dict | None = None, device="cpu", log=None) -> pd.DataFrame:
    """The few-shot records of one method and seed (columns `schemas.FEWSHOT_COLUMNS`): one row per test episode and k.

    A method that trains gives its final checkpoint's `payload` (`training.checkpoint.load`); one that does not, its
    `hyperparameters` (seed = its random stream, as in its evaluation)."""
    check_rule_family(method.id, split.family)
    device = torch.device(device)
    sides = _sides(split, settings, L=L, H=H, episodes_per_rule=episodes_per_rule, eval_seed=eval_seed,
                   success_bonus=success_bonus, noise=noise, goal_mode=goal_mode, goal_steps=goal_steps)
    if sides[0].test.goals is not None and not method.goal_conditioned:
        raise ValueError(f"method {method.id!r} does not take an episode's goal, so it cannot play the multi-goal "
                         f"protocol (env.goal: derived, docs/protocol.md#multi-goal)")
    if method.trains:
        if payload is None:
            raise ValueError(f"method {method.id!r} trains: give its run's final checkpoint")
        checkpoint = int(payload["env_steps"])

        def fresh_policy():
            agent = _policy_agent(method, payload, device)
            return greedy_policy(agent)
    else:
        if payload is not None:
            raise ValueError(f"method {method.id!r} does not train; it has no checkpoint to adapt")
        config = build_config(method.id, hyperparameters)
        checkpoint = 0

        def fresh_policy():
            return method.make_policy(config, PolicyContext(L=L, H=H, seed=int(seed), train_rules=tuple(split.train),
                                                            device=device, family=split.family))
    mode = adaptation_mode(method, fresh_policy())
    if mode != GRADIENT and settings.adapt:
        raise ValueError(f"few-shot adapt overrides {sorted(settings.adapt)} given for {method.id!r}, which adapts "
                         f"{'in context' if mode == CONTEXT else 'not at all'}: they apply to gradient adaptation only")
    frames = []
    for side in sides:
        name = side.test.side
        if mode == NONE:
            results = _play(fresh_policy(), side.test, side, method, device)
            frames += [_frame(results, side.test, side, split.name, k, mode, method, seed, checkpoint)
                       for k in settings.shots]
        elif mode == CONTEXT:
            policy, played = _Carrying(fresh_policy()), 0
            for k in settings.shots:
                for episode in range(played, k):
                    _play(policy, side.adaptation_rows(side.test.rules, episode), side, method, device)
                played = k
                # the test episode from a copy: the next k continues the adaptation, not the test episode
                results = _play(copy.deepcopy(policy), side.test, side, method, device)
                frames.append(_frame(results, side.test, side, split.name, k, mode, method, seed, checkpoint))
        else:
            overrides = {**gradient_recipe(method), **settings.adapt}
            for z in side.rules:
                rows = np.flatnonzero(side.test.rules == z)
                test = side.test.subset(rows)
                agent = _adapting_agent(method, payload, overrides, max(settings.shots) * H, device)
                learner, played = _Learning(agent), 0
                torch.manual_seed(adaptation_torch_seed(seed, side.test.key, name, z))
                for k in settings.shots:
                    for episode in range(played, k):
                        _play(learner, side.adaptation_rows(np.array([z]), episode), side, method, device)
                    played = k
                    results = _play(greedy_policy(agent), test, side, method, device)
                    frames.append(_frame(results, test, side, split.name, k, mode, method, seed, checkpoint))
        if log is not None:
            done = pd.concat([f for f in frames if f["side"].iloc[0] == name])
            shown = ", ".join(f"k={k} {v:.3f}" for k, v in done.groupby("shots")["success"].mean().items())
            log(f"side {name}, {len(side.rules)} rules ({mode} adaptation): strict success {shown}")
    records = pd.concat(frames, ignore_index=True)
    records = records.sort_values(["side", "shots", "rule", "episode"], kind="stable",
                                  key=lambda c: c.map({s: i for i, s in enumerate(SPLIT_SIDES)})
                                  if c.name == "side" else c).reset_index(drop=True)
    return coerce_fewshot_frame(records)


def coerce_fewshot_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Check the columns and dtypes of few-shot records; raises naming missing columns."""
    missing = [c for c in FEWSHOT_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"few-shot records lack columns {missing}; expected {list(FEWSHOT_COLUMNS)}")
    bad = sorted(set(frame["adaptation"].astype(str)) - set(ADAPTATION_MODES))
    if bad:
        raise ValueError(f"few-shot records: adaptation {bad} is not one of {list(ADAPTATION_MODES)}")
    return frame[list(FEWSHOT_COLUMNS)].astype(FEWSHOT_COLUMNS)


def _policy_agent(method: Method, payload: dict, device):
    """The agent of the final checkpoint with its policy weights, as the evaluation builds it."""
    config = build_config(method.id, payload["hyperparameters"])
    agent = method.make_agent(config, EnvSpec(**payload["env_spec"]), payload["total_steps"], device)
    agent.load_policy_state_dict(payload["policy"])
    return agent


def _adapting_agent(method: Method, payload: dict, overrides: dict, budget: int, device):
    """The final checkpoint's policy in an agent of the adaptation hyperparameters (one environment, a fresh
    optimiser) whose schedules span `budget` environment steps."""
    try:
        config = build_config(method.id, {**payload["hyperparameters"], **overrides, "num_envs": 1})
    except ValueError as exc:
        raise ValueError(f"few-shot gradient adaptation of {method.id!r} with overrides {overrides}: {exc}") from None
    agent = method.make_agent(config, EnvSpec(**payload["env_spec"]), max(1, int(budget)), device)
    agent.load_policy_state_dict(payload["policy"])
    return agent
