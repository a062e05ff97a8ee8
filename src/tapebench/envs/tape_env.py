"""Gymnasium environment for TAPE (docs/protocol.md#environment): flip one cell, then one CA update
under a hidden rule."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..ca import reference
from ..validation import (DEFAULT_INIT_DENSITY, DEFAULT_NOISE, as_scalar_action, check_action, check_goal,
                          check_horizon, check_init_density, check_length, check_noise, check_rule, check_rules,
                          check_success_bonus)


class TapeEnv(gym.Env):
    """One binary tape of length L, periodic boundary, hidden elementary-CA rule.

    Args:
        rule: the fixed rule (0..255); ignored when `rules` is given.
        L: tape length (3..64).
        H: horizon; the episode is truncated after H steps.
        goal: goal tape (length L, cells 0/1); default all zeros.
        success_bonus: b in r_t = -dist(s_{t+1}, g) + b * 1[dist = 0].
        rules: optional rule set; a rule is drawn uniformly from it at every reset.
        init_density: rho in (0, 1); initial cells are i.i.d. Bernoulli(rho), redrawn if equal to the goal.
        noise: epsilon in [0, 0.5]; after each CA update every cell flips independently with probability
            epsilon (the success check and the reward see the noisy tape).

    Per-episode ranges of rho and epsilon (domain randomisation) are `BatchedTapeEnv`'s; here each is one
    number. With the defaults (0.5, 0) the random stream is exactly that of an env without them.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, rule: int = 30, L: int = 32, H: int = 32, goal=None, success_bonus: float = 1.0,
                 rules=None, render_mode: str | None = None, init_density: float = DEFAULT_INIT_DENSITY,
                 noise: float = DEFAULT_NOISE):
        self.L = check_length(L)
        self.H = check_horizon(H)
        self.goal = check_goal(goal, self.L)
        self.success_bonus = check_success_bonus(success_bonus)
        self.rules = check_rules(rules) if rules is not None else [check_rule(rule)]
        self.init_density = check_init_density(init_density)
        self.noise = check_noise(noise)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.L + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.L)
        self.rule = self.rules[0]
        self.tape = np.zeros(self.L, dtype=np.uint8)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.append(self.tape.astype(np.float32), np.float32(self.t / self.H))

    def _info(self) -> dict:
        return {"dist": reference.distance(self.tape, self.goal), "rule": self.rule, "t": self.t}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.rule = check_rule(options["rule"]) if "rule" in options else \
            int(self.rules[self.np_random.integers(len(self.rules))])
        if "tape" in options:
            tape = check_goal(options["tape"], self.L, what="initial tape (options['tape'])")
            if np.array_equal(tape, self.goal):
                raise ValueError("initial tape must differ from the goal tape")
            self.tape = tape.copy()
        else:
            self.tape = initial_tape(self.np_random, self.L, self.goal, self.init_density)
        self.t = 0
        return self._obs(), self._info()

    def step(self, action):
        action = check_action(as_scalar_action(action), self.L)
        self.tape = reference.transition(self.tape, action, self.rule)
        if self.noise > 0.0:
            self.tape = self.tape ^ (self.np_random.random(self.L) < self.noise).astype(np.uint8)
        self.t += 1
        dist = reference.distance(self.tape, self.goal)
        success = dist == 0.0
        reward = -dist + (self.success_bonus if success else 0.0)
        truncated = (not success) and self.t >= self.H
        return self._obs(), float(reward), bool(success), bool(truncated), self._info()

    def render(self):
        if self.render_mode == "ansi":
            return "".join("#" if c else "." for c in self.tape)
        return None


def initial_tape(rng: np.random.Generator, L: int, goal: np.ndarray,
                 density: float = DEFAULT_INIT_DENSITY) -> np.ndarray:
    """I.i.d. Bernoulli(density) cells, redrawn while equal to the goal.

    density 0.5 draws fair bits (`integers(0, 2)`), the stream an env without the parameter used."""
    while True:
        if density == DEFAULT_INIT_DENSITY:
            tape = rng.integers(0, 2, size=L, dtype=np.uint8)
        else:
            tape = (rng.random(L) < density).astype(np.uint8)
        if not np.array_equal(tape, goal):
            return tape
