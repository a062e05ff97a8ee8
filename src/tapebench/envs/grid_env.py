"""Gymnasium environment of the grid physics (docs/protocol.md#grid): flip one cell of an n × n torus grid,
then one synchronous update under a hidden outer-totalistic rule.

`gymnasium.make("tapebench/Grid-v0", rule="B3/S23", n=8, H=32)`; von Neumann rules carry the suffix V
(`rule="B1/S12V"`). The reward contract is the tapes' (`envs.outcome`), the initial state is drawn as the
tapes' (`tape_env.initial_tape` over the n² cells, row-major), so a seed gives the same kind of stream.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tapebench.ca import grid_reference
from tapebench.envs.outcome import step_outcome
from tapebench.envs.tape_env import initial_tape
from tapebench.grid_rules import resolve_rules
from tapebench.validation import as_scalar_action, check_action, check_grid_size, check_horizon, check_success_bonus


class GridEnv(gym.Env):
    """One n × n binary grid on a torus, hidden outer-totalistic rule, goal the all-zero grid.

    Args:
        rule: the fixed rule: Golly notation ('B3/S23', 'B1/S12V'), a `GridRule`, or an id of `neighbourhood`;
            ignored when `rules` is given.
        n: grid side (3..32); the action space is Discrete(n²), action a flips cell (a // n, a mod n).
        H: horizon; the episode is truncated after H steps.
        success_bonus: b in r_t = -dist(s_{t+1}) + b · 1[dist = 0], dist the fraction of live cells.
        rules: optional rule set (one neighbourhood); a rule is drawn uniformly from it at every reset.
        neighbourhood: 'moore' or 'von_neumann'; needed only for integer ids (default 'moore'), and must agree
            with rules given in notation.

    Observation: the grid flattened row-major, then t/H (float32, n² + 1 entries). `reset(options=...)` takes
    "rule" (a rule of the family) and "grid" ((n, n) 0/1, not all zero). info: "dist", "rule" (the rule in Golly
    notation, e.g. "B3/S23"), "rule_id" (its id within the family, `GridRule.id`, as the batched env's
    info["rule"]), "t".
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, rule="B3/S23", n: int = 8, H: int = 32, success_bonus: float = 1.0, rules=None,
                 neighbourhood: str | None = None, render_mode: str | None = None):
        self.n = check_grid_size(n)
        self.H = check_horizon(H)
        self.success_bonus = check_success_bonus(success_bonus)
        self.family, self.rules = resolve_rules(rule, rules, neighbourhood)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.n * self.n + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.n * self.n)
        self.rule = self.rules[0]
        self.grid = np.zeros((self.n, self.n), dtype=np.uint8)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.append(self.grid.ravel().astype(np.float32), np.float32(self.t / self.H))

    def _info(self) -> dict:
        return {"dist": grid_reference.distance(self.grid), "rule": str(self.rule), "rule_id": self.rule.id,
                "t": self.t}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.rule = self.family.rule(options["rule"]) if "rule" in options else \
            self.rules[int(self.np_random.integers(len(self.rules)))]
        if "grid" in options:
            grid = grid_reference.check_grids(options["grid"], what="initial grid (options['grid'])")
            if grid.shape != (self.n, self.n) or not grid.any():
                raise ValueError(f"initial grid (options['grid']) must be an ({self.n}, {self.n}) grid with a "
                                 f"live cell, got shape {grid.shape} with {int(grid.sum())} live cells")
            self.grid = grid.copy()
        else:
            cells = self.n * self.n
            self.grid = initial_tape(self.np_random, cells, np.zeros(cells, dtype=np.uint8)).reshape(self.n, self.n)
        self.t = 0
        return self._obs(), self._info()

    def step(self, action):
        action = check_action(as_scalar_action(action), self.n * self.n)
        grid = self.grid.copy()
        grid[action // self.n, action % self.n] ^= 1
        self.grid = grid_reference.update(grid, self.rule)
        self.t += 1
        reward, terminated, truncated = step_outcome(grid_reference.distance(self.grid), self.t, self.H,
                                                     self.success_bonus)
        return self._obs(), reward, terminated, truncated, self._info()

    def render(self):
        if self.render_mode == "ansi":
            return "\n".join("".join("#" if c else "." for c in row) for row in self.grid)
        return None
