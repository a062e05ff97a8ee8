"""Batched torch environment of the grid physics: N grids stepped together, a rule per row, auto-reset
(docs/protocol.md#grid). Semantics match `GridEnv` step for step (tested), as `BatchedTapeEnv` matches `TapeEnv`.

Auto-reset is same-step: the returned observation of a finished row is already the next episode's first
observation; the finished episode's last observation is in info["final_obs"]. Random draws (initial grids,
rules) come from a CPU generator seeded with `seed`, so a seed gives the same episodes on every device.
"""
from __future__ import annotations

import numpy as np
import torch

from tapebench.ca import grid_reference, grid_torch
from tapebench.envs.outcome import step_outcomes
from tapebench.grid_rules import resolve_rules
from tapebench.validation import check_grid_size, check_horizon, check_integer, check_success_bonus


class BatchedGridEnv:
    """N independent grid episodes.

    Args:
        num_envs: parallel grids N (>= 1).
        n, H, success_bonus, neighbourhood: as in `GridEnv`.
        rules: rule set (notation, `GridRule`s or ids of one neighbourhood); every (auto-)reset draws a row's
            rule uniformly from it.
        device: torch device of the state and of everything `step` returns.
        seed: seed of the CPU generator that draws initial grids and rules.
        autoreset: reset finished rows inside `step`.

    `step(actions, flips=None)` returns (obs (N, n² + 1) float32, reward (N,) float32, terminated (N,) bool,
    truncated (N,) bool, info) with info["dist"] (N,) float32 fraction of live cells after the step, info["rule"]
    (N,) int64 rule ids (`GridRule.id` within `family`), info["t"] (N,) int64, and with auto-reset
    info["final_obs"].

    Beside the grid view it has the tape view the evaluation runner and the training loop use for every env
    (`envs.factory`): `L` = n² cells, `tapes` the grids flattened row-major, `load` of flattened grids, `step`'s
    cell-update noise `flips` (N, n²) applied after the update (docs/protocol.md#noise).
    """

    nuisances = False   # no per-row initial density or noise (domain randomisation is a tape option)

    def __init__(self, num_envs: int, n: int = 8, H: int = 32, rules=("B3/S23",), neighbourhood: str | None = None,
                 success_bonus: float = 1.0, device: str | torch.device = "cpu", seed: int = 0,
                 autoreset: bool = True):
        self.num_envs = check_integer(num_envs, "num_envs", 1)
        self.n = check_grid_size(n)
        self.H = check_horizon(H)
        self.family, rule_list = resolve_rules(rules=rules, neighbourhood=neighbourhood)
        self.rule_list = rule_list
        self.success_bonus = check_success_bonus(success_bonus)
        self.autoreset = bool(autoreset)
        self.device = torch.device(device)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        self.rule_set = torch.tensor([rule.id for rule in rule_list], dtype=torch.int64, device=self.device)
        self._set_tables = torch.as_tensor(self.family.tables(rule_list).reshape(len(rule_list), -1),
                                           device=self.device)
        N = self.num_envs
        self.grids = torch.zeros(N, self.n, self.n, dtype=torch.uint8, device=self.device)
        self.tables = torch.zeros(N, 2 * self.family.counts, dtype=torch.uint8, device=self.device)
        self.rules = torch.zeros(N, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(N, dtype=torch.int64, device=self.device)
        self._rows = torch.arange(N, device=self.device)

    @property
    def L(self) -> int:
        """Cells per grid, n²."""
        return self.n * self.n

    @property
    def obs_dim(self) -> int:
        return self.L + 1

    @property
    def tapes(self) -> torch.Tensor:
        """(N, n²) the grids flattened row-major (a view)."""
        return self.grids.view(self.num_envs, self.L)

    def observation(self) -> torch.Tensor:
        cells = self.n * self.n
        obs = torch.empty(self.num_envs, cells + 1, dtype=torch.float32, device=self.device)
        obs[:, :cells] = self.grids.view(self.num_envs, cells)
        torch.div(self.t, self.H, out=obs[:, cells])
        return obs

    def distance(self) -> torch.Tensor:
        return self.grids.view(self.num_envs, -1).sum(dim=1, dtype=torch.float32) / (self.n * self.n)

    def _draw_grids(self, count: int) -> torch.Tensor:
        """`count` grids of i.i.d. fair bits, each redrawn while all zero (the goal)."""
        grids = torch.randint(0, 2, (count, self.n, self.n), generator=self.generator, dtype=torch.uint8)
        empty = grids.view(count, -1).amax(dim=1) == 0   # (`any` of uint8 is uint8, which `~` would negate bitwise)
        while empty.any():
            grids[empty] = torch.randint(0, 2, (int(empty.sum()), self.n, self.n), generator=self.generator,
                                         dtype=torch.uint8)
            empty = grids.view(count, -1).amax(dim=1) == 0
        return grids.to(self.device)

    def _reset_rows(self, rows: torch.Tensor) -> None:
        count = rows.numel()
        if count:
            grids = self._draw_grids(count)
            which = torch.randint(0, len(self.rule_list), (count,), generator=self.generator).to(self.device)
            self.grids[rows] = grids
            self.rules[rows] = self.rule_set[which]
            self.tables[rows] = self._set_tables[which]
            self.t[rows] = 0

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self._reset_rows(self._rows)
        return self.observation()

    def load(self, grids, rules) -> torch.Tensor:
        """Start episodes from explicit initial grids (N, n, n), or flattened row-major (N, n²), and rules (N
        notation strings, `GridRule`s or ids of `family`); rules outside the rule set are allowed (evaluation on
        other rules)."""
        grids_np = grids.cpu().numpy() if isinstance(grids, torch.Tensor) else np.asarray(grids)
        if grids_np.shape == (self.num_envs, self.L):
            grids_np = grids_np.reshape(self.num_envs, self.n, self.n)
        if grids_np.shape != (self.num_envs, self.n, self.n):
            raise ValueError(f"load expects grids of shape {(self.num_envs, self.n, self.n)}, got {grids_np.shape}")
        grids_np = grid_reference.check_grids(grids_np, what="load: grid")
        rule_list = self.family.rules(rules)
        if len(rule_list) != self.num_envs:
            raise ValueError(f"load expects {self.num_envs} rules, got {len(rule_list)}")
        self.grids.copy_(torch.as_tensor(grids_np, device=self.device))
        self.rules.copy_(torch.tensor([rule.id for rule in rule_list], dtype=torch.int64, device=self.device))
        self.tables.copy_(torch.as_tensor(self.family.tables(rule_list).reshape(self.num_envs, -1),
                                          device=self.device))
        self.t.zero_()
        return self.observation()

    def _check_actions(self, actions) -> torch.Tensor:
        actions = torch.as_tensor(actions, device=self.device)
        cells = self.n * self.n
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {tuple(actions.shape)}")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ValueError(f"actions must be integer cell indices in 0..{cells - 1}, got dtype {actions.dtype}")
        low, high = (int(v) for v in torch.aminmax(actions))
        if low < 0 or high >= cells:
            raise ValueError(f"actions must be cell indices in 0..{cells - 1} (row-major), got range {low}..{high}")
        return actions.long()

    def step(self, actions, flips=None):
        """Flip cell (a // n, a mod n) of every row, then one update under the row's rule, then the noise
        `flips` ((N, n²) 0/1, optional: cell-update noise, the same realisation for every method)."""
        actions = self._check_actions(actions)
        self.grids = grid_torch.transition(self.grids, actions, self.tables, self.family)
        if flips is not None:
            flips = torch.as_tensor(flips, device=self.device)
            if tuple(flips.shape) != (self.num_envs, self.L):
                raise ValueError(f"flips must have shape ({self.num_envs}, {self.L}), got {tuple(flips.shape)}")
            self.grids ^= flips.to(torch.uint8).view(self.num_envs, self.n, self.n)
        self.t += 1
        obs = self.observation()
        dist = self.distance()
        reward, terminated, truncated = step_outcomes(dist, self.t, self.H, self.success_bonus)
        info = {"dist": dist, "rule": self.rules.clone(), "t": self.t.clone()}
        if self.autoreset:
            info["final_obs"] = obs
            done_rows = (terminated | truncated).nonzero().squeeze(1)
            if done_rows.numel():
                self._reset_rows(done_rows)
                obs = self.observation()
        return obs, reward, terminated, truncated, info
