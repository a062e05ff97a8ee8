"""Gymnasium environment for TAPE (docs/protocol.md#environment): flip one cell, then one CA update
under a hidden rule.

Rule families (docs/protocol.md#rule-families): `TapeEnv(rule=N, k=3, r=1)` (or `family=RuleFamily(3, 1)`)
has cells in 0..k-1, Wolfram-numbered rules of that family, and the action increments the chosen cell
mod k. `gymnasium.make("tapebench/Tape-v0", rule=N, L=32, H=32, k=3, r=1)` passes k and r through.
The elementary family (k = 2, r = 1, the default) runs its own packed kernel.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tapebench import defaults
from tapebench.ca import reference
from tapebench.envs.outcome import step_outcome
from tapebench.rule_family import RuleFamily
from tapebench.validation import (as_scalar_action, check_action, check_goal,
                                  check_horizon, check_init_density, check_length, check_noise, check_rule, check_rules,
                                  check_success_bonus, resolve_family)


class TapeEnv(gym.Env):
    """One tape of length L, periodic boundary, hidden CA rule (elementary by default).

    Args:
        rule: the fixed rule (0..255, or a rule number of the family); ignored when `rules` is given.
        L: tape length (3..64).
        H: horizon; the episode is truncated after H steps.
        goal: goal tape (length L, cells 0/1, or 0..k-1); default all zeros.
        success_bonus: b in r_t = -dist(s_{t+1}, g) + b * 1[dist = 0].
        rules: optional rule set; a rule is drawn uniformly from it at every reset.
        init_density: rho in (0, 1); initial cells are i.i.d. Bernoulli(rho), redrawn if equal to the goal.
        noise: epsilon in [0, 0.5]; after each CA update every cell flips independently with probability
            epsilon (the success check and the reward see the noisy tape). With k > 2 a noisy cell takes a
            uniformly random other colour.
        k, r: the rule family (colours 2..4, radius 1..2); or `family`, a `RuleFamily`. Cells are 0..k-1,
            the observation's tape part lies in Box(0, k-1), the initial tape is i.i.d. uniform over the k
            colours (init_density applies to k = 2 only).
        goal_in_obs: the observation is [s, g, t/H] (2L + 1 entries), the multi-goal protocol's
            (docs/protocol.md#multi-goal); default [s, t/H].

    `reset(options={"goal": g})` plays that episode towards the goal tape g (the multi-goal protocol's per-episode
    goals); an episode without it has the env's `goal`.

    Per-episode ranges of rho and epsilon (domain randomisation) are `BatchedTapeEnv`'s; here each is one
    number. With the defaults (0.5, 0) the random stream is exactly that of an env without them.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, rule: int = 30, L: int = defaults.L, H: int = defaults.H, goal=None,
                 success_bonus: float = defaults.SUCCESS_BONUS,
                 rules=None, render_mode: str | None = None, init_density: float = defaults.INIT_DENSITY,
                 noise: float = defaults.NOISE, k: int | None = None, r: int | None = None,
                 family: RuleFamily | None = None, goal_in_obs: bool = False):
        self.family = resolve_family(family, k, r)
        self.L = check_length(L)
        self.H = check_horizon(H)
        self.goal = check_goal(goal, self.L, family=self.family)
        self._env_goal = self.goal
        self.goal_in_obs = bool(goal_in_obs)
        self.success_bonus = check_success_bonus(success_bonus)
        self.rules = check_rules(rules, self.family) if rules is not None else [check_rule(rule, self.family)]
        self.init_density = check_init_density(init_density)
        if self.family.k != 2 and self.init_density != defaults.INIT_DENSITY:
            raise ValueError(f"init_density applies to binary tapes (k = 2); with k = {self.family.k} the "
                             f"initial cells are uniform over the colours, got init_density={init_density}")
        self.noise = check_noise(noise)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        size = 2 * self.L + 1 if self.goal_in_obs else self.L + 1
        if self.family.k == 2:
            self.observation_space = spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        else:   # tape (and goal) cells in 0..k-1, then t/H in [0, 1]
            high = np.full(size, self.family.k - 1, dtype=np.float32)
            high[-1] = 1.0
            self.observation_space = spaces.Box(np.zeros(size, dtype=np.float32), high, dtype=np.float32)
        self._table = None if self.family.elementary else self.family.table(self.rules[0])
        self.action_space = spaces.Discrete(self.L)
        self.rule = self.rules[0]
        self.tape = np.zeros(self.L, dtype=np.uint8)
        self.t = 0

    def _obs(self) -> np.ndarray:
        if self.goal_in_obs:
            return np.concatenate([self.tape.astype(np.float32), self.goal.astype(np.float32),
                                   [np.float32(self.t / self.H)]]).astype(np.float32)
        return np.append(self.tape.astype(np.float32), np.float32(self.t / self.H))

    def _info(self) -> dict:
        return {"dist": reference.distance(self.tape, self.goal), "rule": self.rule, "t": self.t}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.rule = check_rule(options["rule"], self.family) if "rule" in options else \
            int(self.rules[self.np_random.integers(len(self.rules))])
        if not self.family.elementary:
            self._table = self.family.table(self.rule)
        self.goal = check_goal(options["goal"], self.L, what="goal tape (options['goal'])", family=self.family) \
            if "goal" in options else self._env_goal
        if "tape" in options:
            tape = check_goal(options["tape"], self.L, what="initial tape (options['tape'])", family=self.family)
            if np.array_equal(tape, self.goal):
                raise ValueError("initial tape must differ from the goal tape")
            self.tape = tape.copy()
        else:
            self.tape = initial_tape(self.np_random, self.L, self.goal, self.init_density, self.family.k)
        self.t = 0
        return self._obs(), self._info()

    def step(self, action):
        action = check_action(as_scalar_action(action), self.L)
        if self.family.elementary:
            self.tape = reference.transition(self.tape, action, self.rule)
        else:
            self.tape = family_transition(self.tape, action, self._table, self.family)
        if self.noise > 0.0:
            noisy = (self.np_random.random(self.L) < self.noise).astype(np.uint8)
            if self.family.k == 2:
                self.tape = self.tape ^ noisy
            else:   # a noisy cell moves to a uniformly random other colour
                shift = self.np_random.integers(1, self.family.k, size=self.L, dtype=np.uint8)
                self.tape = ((self.tape + noisy * shift) % self.family.k).astype(np.uint8)
        self.t += 1
        reward, terminated, truncated = step_outcome(reference.distance(self.tape, self.goal), self.t, self.H,
                                                     self.success_bonus)
        return self._obs(), reward, terminated, truncated, self._info()

    def render(self):
        if self.render_mode == "ansi":
            if self.family.k == 2:
                return "".join("#" if c else "." for c in self.tape)
            return "".join(".123"[c] for c in self.tape)
        return None


def family_transition(tape: np.ndarray, action: int, table: np.ndarray, family: RuleFamily) -> np.ndarray:
    """s' = F(G(s, a)) for a family (k, r) given the rule's table: increment cell a mod k, then look every
    cell's neighbourhood index up in the table (vectorised; equal to `reference.transition`, tested)."""
    tape = tape.copy()
    tape[action] = (tape[action] + 1) % family.k
    idx = np.zeros(len(tape), dtype=np.int64)
    for j in range(-family.r, family.r + 1):   # x[i+j] is np.roll(tape, -j)[i]
        idx = idx * family.k + np.roll(tape, -j)
    return table[idx]


def initial_tape(rng: np.random.Generator, L: int, goal: np.ndarray,
                 density: float = defaults.INIT_DENSITY, k: int = 2) -> np.ndarray:
    """I.i.d. Bernoulli(density) cells (k = 2) or uniform colours 0..k-1, redrawn while equal to the goal.

    density 0.5 draws fair bits (`integers(0, 2)`), the stream an env without the parameter used."""
    while True:
        if density == defaults.INIT_DENSITY:
            tape = rng.integers(0, k, size=L, dtype=np.uint8)
        else:
            tape = (rng.random(L) < density).astype(np.uint8)
        if not np.array_equal(tape, goal):
            return tape
