"""Common random numbers for evaluation (docs/protocol.md#decisions).

The initial tape of episode k of rule z on a side is a pure function of
(eval_seed, split key, side, z, k): identical for every agent, seed, checkpoint and the oracle.
The tape does not depend on H, so H = 32 and H = 64 evaluations are paired too.
For a family with k > 2 colours the cells are uniform over 0..k-1 (same stream; the elementary family
keeps its Bernoulli(0.5) tapes bit for bit).

Stochastic dynamics (docs/protocol.md#noise): with cell-update noise epsilon > 0, cell i flips after the CA
update of step t (t = 0, 1, ...) iff u(episode, t, i) < epsilon, where u is a counter-based uniform in [0, 1)
keyed by the same identity (a third stream, `noise_key`). Flips do not depend on actions, so every method plays
the same noise realisation; they do not depend on H, batching or order either, and the same u serve every
epsilon (the flips at a smaller epsilon are a subset of those at a larger one). With k > 2 colours a noisy
cell moves to another colour, c + s mod k with s = 1 + floor((k - 1) u / epsilon), uniform over 1..k-1 given
u < epsilon.

Multi-goal protocol (docs/protocol.md#multi-goal, `goal="derived"`): episode k's goal is the tape its rule reaches
from its initial tape in 1..goal_steps random steps (`episodes.worldtest.reachable_goal`, the world test's planning
goals), drawn from a fourth stream of the same identity (`goal_stream`), so every method plays the same goals and
the initial tapes are those of the all-zero-goal protocol.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tapebench.episodes.streams import (check_side, episode_key, goal_stream, identity, noise_key, noise_uniforms,
                                        training_goal_stream)
from tapebench.episodes.worldtest import reachable_goal
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.validation import check_goal, check_goal_mode, check_length, check_noise, check_rules
from tapebench.vocabulary import DERIVED_GOAL, ZEROS_GOAL


def noise_flips(noise_keys: np.ndarray, t: int, L: int, noise: float, colours: int = 2) -> np.ndarray:
    """(N, L) uint8 colour shifts applied after the CA update of step t (added mod `colours`): non-zero with
    probability `noise` per cell; for two colours the shift is the flip mask, for k > 2 uniform over 1..k-1."""
    uniforms = noise_uniforms(noise_keys, t, L)
    noisy = uniforms < float(noise)
    if colours == 2:
        return noisy.astype(np.uint8)
    shift = 1 + np.floor(uniforms / float(noise) * (colours - 1)).astype(np.int64)
    return np.where(noisy, np.minimum(shift, colours - 1), 0).astype(np.uint8)


def episode_tape(eval_seed: int, key: int, side: str, rule: int, episode: int, L: int, goal,
                 colours: int = 2) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence(identity(eval_seed, key, side, rule, episode)))
    while True:
        tape = rng.integers(0, colours, size=L, dtype=np.uint8)
        if not np.array_equal(tape, goal):
            return tape


def derived_goal(eval_seed: int, key: int, side: str, rule: int, episode: int, start: np.ndarray,
                 goal_steps: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """(goal, witness actions, found) of one episode in the multi-goal protocol: `reachable_goal` from its start on
    its own stream. A rule that reaches no tape other than the start and 0...0 in the draws (rule 0) keeps the last
    tape reached (found False); the witness reaches it all the same."""
    _, goal, actions, found = reachable_goal(goal_stream(eval_seed, key, side, rule, episode), int(rule),
                                             len(start), goal_steps, start=start)
    return goal, actions, found


class TrainingGoals:
    """The goal sampler of a training environment under the multi-goal protocol (`BatchedTapeEnv(goal_sampler=...)`):
    every episode a row starts gets a goal its rule reaches from its initial tape in 1..goal_steps random steps
    (`reachable_goal`, as an evaluation episode's), drawn from the row's own stream (`training_goal_stream` of the
    env seed, the row and the row's episode count), so a run's goals are a function of its seed. `episodes` (the
    per-row counts) is the whole state a resumed run restores."""

    def __init__(self, env_seed: int, num_envs: int, goal_steps: int):
        self.env_seed, self.goal_steps = int(env_seed), int(goal_steps)
        self.episodes = np.zeros(int(num_envs), dtype=np.int64)

    def __call__(self, rows: np.ndarray, tapes: np.ndarray, rules: list[int]) -> np.ndarray:
        goals = np.empty_like(tapes)
        for i, (row, rule) in enumerate(zip(rows.tolist(), rules)):
            stream = training_goal_stream(self.env_seed, row, self.episodes[row])
            self.episodes[row] += 1
            goals[i] = reachable_goal(stream, int(rule), tapes.shape[1], self.goal_steps, start=tapes[i])[1]
        return goals

    def state_dict(self) -> dict:
        return {"episodes": self.episodes.copy()}

    def load_state_dict(self, state: dict) -> None:
        episodes = np.asarray(state["episodes"], dtype=np.int64)
        if episodes.shape != self.episodes.shape:
            raise ValueError(f"resume state has goal counters for {episodes.shape[0]} rows, the environment "
                             f"{self.episodes.shape[0]}")
        self.episodes = episodes.copy()


@dataclass(frozen=True)
class EpisodeSet:
    """Rows are episodes: rule-major, episode index k = 0..E-1 within each rule."""

    rules: np.ndarray      # (N,) int
    episodes: np.ndarray   # (N,) int
    tapes: np.ndarray      # (N, L) uint8 initial tapes
    side: str
    key: int
    keys: np.ndarray       # (N,) uint64 episode identities (`episode_key`)
    family: RuleFamily = field(default=ELEMENTARY)
    noise: float = 0.0     # cell-update noise epsilon; 0 = the noise-free dynamics
    noise_keys: np.ndarray | None = None   # (N,) uint64 noise streams (`noise_key`) when noise > 0
    goals: np.ndarray | None = None        # (N, L) uint8 per-episode goals (multi-goal protocol); None: one goal

    def flips(self, t: int) -> np.ndarray | None:
        """The (N, L) uint8 noise shifts after the CA update of step t (`noise_flips`), or None without noise."""
        if self.noise == 0.0:
            return None
        return noise_flips(self.noise_keys, t, self.tapes.shape[1], self.noise, self.family.k)

    def __len__(self) -> int:
        return len(self.rules)

    def subset(self, rows) -> "EpisodeSet":
        """The episodes at `rows` (a slice or index array), identities unchanged."""
        return EpisodeSet(self.rules[rows], self.episodes[rows], self.tapes[rows], self.side, self.key,
                          self.keys[rows], self.family, self.noise,
                          None if self.noise_keys is None else self.noise_keys[rows],
                          None if self.goals is None else self.goals[rows])


def episode_set(rules, episodes_per_rule: int, L: int, *, eval_seed: int = 0, key: int = 0,
                side: str = "rules", goal=None, family: RuleFamily = ELEMENTARY, noise: float = 0.0,
                goal_mode: str = ZEROS_GOAL, goal_steps: int = 8) -> EpisodeSet:
    """The episodes of `rules` (rule-major), with the noise realisation of epsilon = `noise` (docstring above).
    `goal_mode` "derived" gives every episode its own goal (`derived_goal`, at most `goal_steps` steps away);
    the fixed `goal` then must be left at the all-zero default."""
    goal_mode, goal_steps = check_goal_mode(goal_mode, goal_steps)
    rules = check_rules(rules, family)
    if not family.fits_int64:
        raise ValueError(f"evaluation episodes store rules as int64; {family.describe()} has rules beyond 64 bits")
    noise = float(check_noise(noise))
    L = check_length(L)
    side = check_side(side)
    if int(episodes_per_rule) < 1:
        raise ValueError(f"episodes_per_rule must be >= 1, got {episodes_per_rule}")
    goal = check_goal(goal, L)
    rule_col = np.repeat(np.asarray(rules, dtype=np.int64), episodes_per_rule)
    ep_col = np.tile(np.arange(episodes_per_rule, dtype=np.int64), len(rules))
    tapes = np.stack([episode_tape(eval_seed, key, side, z, k, L, goal, family.k) for z, k in zip(rule_col, ep_col)])
    keys = np.array([episode_key(eval_seed, key, side, z, k) for z, k in zip(rule_col, ep_col)], dtype=np.uint64)
    noise_keys = None
    if noise > 0.0:
        noise_keys = np.array([noise_key(eval_seed, key, side, z, k) for z, k in zip(rule_col, ep_col)],
                              dtype=np.uint64)
    goals = None
    if goal_mode == DERIVED_GOAL:
        if not family.elementary or L > 64 or goal.any():
            raise ValueError(f"derived goals (env.goal: {DERIVED_GOAL}) need elementary rules, L <= 64 and no fixed "
                             f"goal tape, got {family.describe()}, L={L}, a goal with {int(goal.sum())} live cells")
        goals = np.stack([derived_goal(eval_seed, key, side, z, k, tape, goal_steps)[0]
                          for z, k, tape in zip(rule_col, ep_col, tapes)])
    return EpisodeSet(rule_col, ep_col, tapes, side, key, keys, family, noise, noise_keys, goals)
