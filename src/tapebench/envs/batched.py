"""Batched torch environment: N tapes stepped together, a rule per row, auto-reset (docs/protocol.md#environment).

This is what training and evaluation use. Semantics match `TapeEnv` step for step (tested).
Auto-reset is same-step: the returned observation of a finished row is already the next
episode's first observation; the finished episode's last observation is in info["final_obs"].

Random draws (initial tapes, rules, per-row nuisance values, cell-update noise) always come from a
CPU generator seeded with `seed`, so a seed gives the same episodes on every device. The tapes live
in a periodic padded buffer that the torch kernel updates in place (see `ca.torch_kernel`); `tapes`
is a (N, L) view of it.

Rule families (docs/protocol.md#rule-families):
`BatchedTapeEnv(num_envs, L, H, rules=[...], family=RuleFamily(3, 1))` (or `k=3, r=1`). Cells are 0..k-1,
the action increments a cell mod k, and every row holds its rule's TABLE ((N, k^(2r+1)) uint8, stepped by
`ca.torch_table_kernel`), so rule numbers beyond 64 bits never reach a tensor. `info["rule"]` and `rules`
are per-row rule ids: the rule number (int64) when the family's numbers fit int64 (`family.fits_int64`),
else the row's index into `rule_numbers` (a list of Python ints: the rule set, then any rule `load`
brought in). `row_rules()` gives the rule numbers of the rows in every case. The elementary family (the
default) keeps its own kernel, uint8 rules and the random stream of a binary tape.

`StackedEnvs` steps the S envs of a seed block (one per seed, each with its own generator) as one batch of S x n rows;
`seed_block_step` is a block's step, stacked where `StackedEnvs` covers the envs.
"""
from __future__ import annotations

import numpy as np
import torch

from tapebench import defaults
from tapebench.ca import torch_kernel, torch_table_kernel
from tapebench.envs.outcome import goal_distances, step_outcomes
from tapebench.rule_family import RuleFamily
from tapebench.validation import (check_goal, check_horizon, check_init_density,
                                  check_length, check_noise, check_rules, check_success_bonus, resolve_family)


class BatchedTapeEnv:
    """N independent TAPE episodes.

    Args:
        num_envs: number of parallel tapes N (>= 1).
        L, H, goal, success_bonus: as in `TapeEnv`.
        rules: rule set; every reset (and auto-reset) draws a row's rule uniformly from it.
        device: torch device of the state and of everything `step` returns.
        seed: seed of the CPU generator that draws initial tapes and rules.
        autoreset: reset finished rows inside `step` (same-step auto-reset).
        init_density: rho in (0, 1), initial cells i.i.d. Bernoulli(rho) (redrawn if equal to the goal);
            or a range (low, high): each row draws its rho ~ U[low, high] at every (auto-)reset.
        noise: epsilon in [0, 0.5], after each CA update every cell flips independently with probability
            epsilon (success and reward are judged after the noise); or a range (low, high) drawn per
            row at every (auto-)reset like rho. Ranges are domain randomisation for training;
            evaluation uses the defaults (rho = 0.5, epsilon = 0).
        k, r or family: the rule family (default elementary). With k > 2 the initial cells are uniform over
            the k colours (init_density must stay at its default) and a noisy cell takes a uniformly random
            other colour.
        goal_in_obs: the observation carries the row's goal, [s, g, t/H] (2L + 1 entries; the multi-goal protocol,
            docs/protocol.md#multi-goal); default [s, t/H].
        goal_sampler: training under the multi-goal protocol: a callable (rows, tapes, rules) -> (n, L) goals that
            gives every row it starts (reset, auto-reset, `load` without goals) a goal of its own, from the row
            indices (int64 numpy), the rows' initial tapes ((n, L) uint8 numpy) and rule numbers (list of ints);
            elementary rules only. Its state (e.g. per-row episode counters) is its own.

    Per-row goals: `load(tapes, rules, goals=...)` gives every row its own goal tape (evaluation of the multi-goal
    protocol; an env without auto-reset); distance, reward and success are then to the row's goal. Without them
    every row's goal is `goal`.

    With the defaults the env draws fair bits for the tapes and no noise. The rows' current values are
    `row_density` and `row_noise` ((N,) float32, on the CPU); `reset`, auto-reset and `load` draw them for the
    rows they start.

    `step(actions)` returns (obs (N, L+1) float32, reward (N,) float32, terminated (N,) bool,
    truncated (N,) bool, info) with info["dist"] (N,) float32 normalised distance after the step,
    info["rule"] (N,) uint8 rule of the step (a family: int64 rule ids, see the module docstring), info["t"] (N,) int64 steps taken in the episode, and
    with auto-reset info["final_obs"] (N, L+1): the observation before any row was reset.
    """

    def __init__(self, num_envs: int, L: int = defaults.L, H: int = defaults.H, rules=(30,), goal=None,
                 success_bonus: float = defaults.SUCCESS_BONUS, device: str | torch.device = "cpu", seed: int = 0,
                 autoreset: bool = True, init_density=defaults.INIT_DENSITY, noise=defaults.NOISE,
                 k: int | None = None, r: int | None = None, family: RuleFamily | None = None,
                 goal_in_obs: bool = False, goal_sampler=None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        self.family = resolve_family(family, k, r)
        self.num_envs = int(num_envs)
        self.L = check_length(L)
        self.H = check_horizon(H)
        self.device = torch.device(device)
        if self.family.elementary:
            self.rule_set = torch.tensor(check_rules(rules), dtype=torch.uint8, device=self.device)
        else:
            self._init_family_rules(check_rules(rules, self.family))
        goal = check_goal(goal, self.L, family=self.family)
        self.goal = torch.as_tensor(goal, device=self.device)
        self._goal_cpu = torch.as_tensor(goal)
        # dist count = tape . (1 - 2g) + sum(g): exact small integers in float32
        self._goal_sign = torch.as_tensor(1.0 - 2.0 * goal, dtype=torch.float32, device=self.device)
        self._goal_ones = float(goal.sum())
        self.goal_in_obs = bool(goal_in_obs)
        self._row_goals: torch.Tensor | None = None   # (N, L) uint8 per-row goals from `load`, or None
        self.goal_sampler = goal_sampler
        if goal_sampler is not None and not self.family.elementary:
            raise ValueError(f"a goal sampler (derived training goals) needs elementary rules, not "
                             f"{self.family.describe()}")
        self.success_bonus = check_success_bonus(success_bonus)
        self.autoreset = bool(autoreset)
        # a degenerate range (x, x) is the constant x: no per-row draws
        self.init_density = _constant_if_degenerate(check_init_density(init_density, allow_range=True))
        self.noise = _constant_if_degenerate(check_noise(noise, allow_range=True))
        if self.family.k != 2 and self.init_density != defaults.INIT_DENSITY:
            raise ValueError(f"init_density applies to binary tapes (k = 2); with k = {self.family.k} the "
                             f"initial cells are uniform over the colours, got init_density={init_density}")
        self._fair_bits = self.init_density == defaults.INIT_DENSITY   # the original Bernoulli(0.5) draws
        self._noisy = self.noise != defaults.NOISE
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        n, L = self.num_envs, self.L
        if self.family.elementary:
            self._padded = torch.zeros(n, L + 2, dtype=torch.uint8, device=self.device)
            self._plane = torch.zeros(n, L, dtype=torch.uint8, device=self.device)
            self._scratch = torch.empty(n, L, dtype=torch.uint8, device=self.device)
            self._row_offsets = torch_kernel.flat_row_offsets(n, L, device=self.device)
            self.rules = torch.zeros(n, dtype=torch.uint8, device=self.device)
        else:
            r = self.family.r
            self._padded = torch.zeros(n, L + 2 * r, dtype=torch.uint8, device=self.device)
            self._tables = torch.zeros(n, self.family.neighbourhoods, dtype=torch.uint8, device=self.device)
            self._table_scratch = torch_table_kernel.StepScratch(n, L, r, device=self.device)
            self._row_offsets = torch_table_kernel.flat_row_offsets(n, L, r, device=self.device)
            self.rules = torch.zeros(n, dtype=torch.int64, device=self.device)
            self._row_index = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.row_density = torch.full((n,), _low(self.init_density), dtype=torch.float32)
        self.row_noise = torch.full((n,), _low(self.noise), dtype=torch.float32)

    @property
    def randomised(self) -> bool:
        """Whether init_density or noise is a per-row range (domain randomisation)."""
        return isinstance(self.init_density, tuple) or isinstance(self.noise, tuple)

    @property
    def nuisances(self) -> bool:
        """Whether init_density or noise differs from the defaults (rho = 0.5, epsilon = 0)."""
        return not self._fair_bits or self._noisy

    # --- rule families ---------------------------------------------------------------------
    def _init_family_rules(self, rule_numbers: list[int]) -> None:
        """The rule set of a non-elementary family: numbers, tables, and the per-entry rule ids."""
        self.rule_numbers: list[int] = []
        self._rule_position: dict[int, int] = {}
        self._known_tables = torch.empty(0, self.family.neighbourhoods, dtype=torch.uint8, device=self.device)
        self._known_ids = torch.empty(0, dtype=torch.int64, device=self.device)
        positions = self._positions_of(rule_numbers)
        self._num_reset_rules = len(rule_numbers)
        self._reset_positions = torch.tensor(positions, dtype=torch.int64, device=self.device)
        self.rule_set = self._rule_ids(self._reset_positions)

    def _positions_of(self, rule_numbers: list[int]) -> list[int]:
        """Positions of the rules in `rule_numbers`, appending the rules (and tables) not seen before."""
        new = [z for z in dict.fromkeys(rule_numbers) if z not in self._rule_position]
        if new:
            for z in new:
                self._rule_position[z] = len(self.rule_numbers)
                self.rule_numbers.append(z)
            tables = torch.as_tensor(self.family.tables(new), device=self.device)
            self._known_tables = torch.cat([self._known_tables, tables])
            start = len(self.rule_numbers) - len(new)
            ids = new if self.family.fits_int64 else range(start, len(self.rule_numbers))
            self._known_ids = torch.cat([self._known_ids,
                                         torch.tensor(list(ids), dtype=torch.int64, device=self.device)])
        return [self._rule_position[z] for z in rule_numbers]

    def _rule_ids(self, positions: torch.Tensor) -> torch.Tensor:
        """Per-row rule ids: rule numbers (int64) if the family fits int64, else positions."""
        return self._known_ids[positions]

    def row_rules(self) -> list[int]:
        """The rule number of every row (Python ints; exact for every family)."""
        if self.family.elementary:
            return [int(z) for z in self.rules.tolist()]
        return [self.rule_numbers[i] for i in self._row_index.tolist()]

    # --- state -----------------------------------------------------------------------------
    @property
    def tapes(self) -> torch.Tensor:
        """Current tapes, a (N, L) uint8 view of the padded state buffer."""
        if self.family.elementary:
            return torch_kernel.interior(self._padded)
        return torch_table_kernel.interior(self._padded, self.family.r)

    @property
    def obs_dim(self) -> int:
        return 2 * self.L + 1 if self.goal_in_obs else self.L + 1

    def row_goals(self) -> torch.Tensor:
        """(N, L) uint8: every row's goal tape (`goal` in every row unless `load` gave per-row goals)."""
        if self._row_goals is not None:
            return self._row_goals
        return self.goal.to(torch.uint8).expand(self.num_envs, self.L)

    def observation(self) -> torch.Tensor:
        obs = torch.empty(self.num_envs, self.obs_dim, dtype=torch.float32, device=self.device)
        obs[:, :self.L] = self.tapes
        if self.goal_in_obs:
            obs[:, self.L:2 * self.L] = self.row_goals()
        torch.div(self.t, self.H, out=obs[:, -1])
        return obs

    def distance(self) -> torch.Tensor:
        goal = self.goal if self._row_goals is None else self._row_goals
        return (self.tapes != goal).sum(dim=1).float() / self.L

    def _draw_tapes(self, n: int, density: torch.Tensor | None = None) -> torch.Tensor:
        """n initial tapes, each redrawn while equal to the goal: fair bits, or with `density` ((n,) on the
        CPU) row k's cells i.i.d. Bernoulli(density[k])."""
        def draw(count: int, rows_density: torch.Tensor | None) -> torch.Tensor:
            if rows_density is None:   # fair bits for k = 2, uniform colours for k > 2
                return torch.randint(0, self.family.k, (count, self.L), generator=self.generator,
                                     dtype=torch.uint8)
            uniform = torch.rand(count, self.L, generator=self.generator)
            return (uniform < rows_density.unsqueeze(1)).to(torch.uint8)

        tapes = draw(n, density)
        same = (tapes == self._goal_cpu).all(dim=1)
        while same.any():
            tapes[same] = draw(int(same.sum()), None if density is None else density[same])
            same = (tapes == self._goal_cpu).all(dim=1)
        return tapes.to(self.device)

    def _draw_row_nuisances(self, rows: torch.Tensor) -> None:
        """Draw rho, then epsilon, for the given rows where they are ranges (no draws for constants)."""
        rows = rows.cpu()
        for value, row_values in ((self.init_density, self.row_density), (self.noise, self.row_noise)):
            if isinstance(value, tuple):
                low, high = value
                row_values[rows] = low + (high - low) * torch.rand(rows.numel(), generator=self.generator)

    def _draw_rules(self, n: int) -> torch.Tensor:
        """Elementary: n rules drawn from the set; a family: n positions in `rule_numbers`."""
        idx = torch.randint(0, len(self.rule_set), (n,), generator=self.generator)
        if self.family.elementary:
            return self.rule_set[idx.to(self.device)]
        return self._reset_positions[idx.to(self.device)]

    def _set_rows(self, rows: torch.Tensor, tapes: torch.Tensor, rules: torch.Tensor) -> None:
        """rules: elementary rule numbers, or (a family) positions in `rule_numbers`."""
        self.tapes[rows] = tapes
        if self.family.elementary:
            self.rules[rows] = rules
            self._plane[rows] = rules.unsqueeze(1)
        else:
            self._row_index[rows] = rules
            self.rules[rows] = self._rule_ids(rules)
            self._tables[rows] = self._known_tables[rules]
        self.t[rows] = 0

    def _reset_rows(self, rows: torch.Tensor) -> None:
        """Start new episodes in the given rows (a 1-D index tensor)."""
        n = rows.numel()
        if n:
            if self.randomised:
                self._draw_row_nuisances(rows)
            density = None if self._fair_bits else self.row_density[rows.cpu()]
            self._set_rows(rows, self._draw_tapes(n, density), self._draw_rules(n))
            if self.goal_sampler is not None:
                self._sample_goals(rows)

    def _sample_goals(self, rows: torch.Tensor) -> None:
        """The goal sampler's goals for the rows just started (after their tapes and rules are set)."""
        rows_np = rows.cpu().numpy().astype(np.int64)
        goals = np.asarray(self.goal_sampler(rows_np, self.tapes[rows].cpu().numpy(),
                                             [int(z) for z in self.rules[rows].tolist()]), dtype=np.uint8)
        if goals.shape != (len(rows_np), self.L):
            raise ValueError(f"the goal sampler returned goals of shape {goals.shape}, expected "
                             f"{(len(rows_np), self.L)}")
        if self._row_goals is None:
            self._row_goals = self.goal.to(torch.uint8).expand(self.num_envs, self.L).clone()
        self._row_goals[rows] = torch.as_tensor(goals, device=self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self._reset_rows(torch.arange(self.num_envs, device=self.device))
        return self.observation()

    def load(self, tapes, rules, goals=None) -> torch.Tensor:
        """Start episodes from explicit initial tapes (N, L) and rules (N,): evaluation uses this.
        Per-row ranges of rho and epsilon are drawn for the new episodes as at a reset.
        `goals` ((N, L) 0/1 cells, elementary rules, an env without auto-reset): each row's own goal.
        For a family, `rules` are rule numbers (a list of Python ints, or an integer array / tensor when
        they fit int64); rules outside the rule set are appended to `rule_numbers` (resets still draw
        from the rule set only)."""
        if goals is not None:
            self._load_goals(goals)
        if not self.family.elementary:
            return self._load_family(tapes, rules)
        tapes_np = tapes.cpu().numpy() if isinstance(tapes, torch.Tensor) else np.asarray(tapes)
        rules_np = rules.cpu().numpy() if isinstance(rules, torch.Tensor) else np.asarray(rules)
        if tapes_np.shape != (self.num_envs, self.L) or rules_np.shape != (self.num_envs,):
            raise ValueError(f"load expects tapes of shape {(self.num_envs, self.L)} and rules of shape "
                             f"({self.num_envs},), got {tapes_np.shape} and {rules_np.shape}")
        rules_t = torch.tensor(check_rules(rules_np), dtype=torch.uint8, device=self.device)
        if tapes_np.dtype.kind not in "biuf" or not np.all((tapes_np == 0) | (tapes_np == 1)):
            bad = sorted(set(np.unique(tapes_np).tolist()) - {0, 1})
            raise ValueError(f"load: tape cells must be 0 or 1, got values {bad}")
        rows = torch.arange(self.num_envs, device=self.device)
        if self.randomised:
            self._draw_row_nuisances(rows)
        self._set_rows(rows, torch.as_tensor(tapes_np.astype(np.uint8), device=self.device), rules_t)
        if self.goal_sampler is not None and goals is None:
            self._sample_goals(rows)
        return self.observation()

    def _load_goals(self, goals) -> None:
        if (self.autoreset and self.goal_sampler is None) or not self.family.elementary:
            raise ValueError("per-row goals need elementary rules and an env without auto-reset (autoreset=False) or "
                             "with a goal sampler: a reset would not know the next episode's goal")
        goals_np = goals.cpu().numpy() if isinstance(goals, torch.Tensor) else np.asarray(goals)
        if goals_np.shape != (self.num_envs, self.L) or not np.all((goals_np == 0) | (goals_np == 1)):
            raise ValueError(f"load: goals must be an ({self.num_envs}, {self.L}) array of 0/1 cells, got shape "
                             f"{goals_np.shape}")
        self._row_goals = torch.as_tensor(goals_np.astype(np.uint8), device=self.device)

    def _load_family(self, tapes, rules) -> torch.Tensor:
        tapes_np = tapes.cpu().numpy() if isinstance(tapes, torch.Tensor) else np.asarray(tapes)
        rule_list = rules.tolist() if hasattr(rules, "tolist") else list(rules)
        if tapes_np.shape != (self.num_envs, self.L) or len(rule_list) != self.num_envs:
            raise ValueError(f"load expects tapes of shape {(self.num_envs, self.L)} and {self.num_envs} rules, "
                             f"got {tapes_np.shape} and {len(rule_list)}")
        positions = self._positions_of(check_rules(rule_list, self.family))
        tapes_t = torch.as_tensor(self.family.check_cells(tapes_np, what="load: tape"), device=self.device)
        rows = torch.arange(self.num_envs, device=self.device)
        if self.randomised:
            self._draw_row_nuisances(rows)
        self._set_rows(rows, tapes_t, torch.tensor(positions, dtype=torch.int64, device=self.device))
        return self.observation()

    # --- dynamics --------------------------------------------------------------------------
    def _check_actions(self, actions) -> torch.Tensor:
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {tuple(actions.shape)}")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ValueError(f"actions must be integer cell indices in 0..{self.L - 1}, got dtype {actions.dtype}")
        low, high = torch.aminmax(actions)
        low, high = int(low), int(high)  # one host sync; on CPU it costs nothing
        if low < 0 or high >= self.L:
            raise ValueError(f"actions must be cell indices in 0..{self.L - 1}, got range {low}..{high}")
        return actions.long()

    def _check_flips(self, flips) -> torch.Tensor:
        if self._noisy:
            raise ValueError(f"explicit noise flips need an env without noise of its own, but noise = {self.noise}")
        flips = torch.as_tensor(flips, device=self.device)
        if flips.shape != (self.num_envs, self.L):
            raise ValueError(f"flips must have shape ({self.num_envs}, {self.L}), got {tuple(flips.shape)}")
        if flips.numel() and int(flips.max()) >= self.family.k:
            raise ValueError(f"flips must be colour shifts in 0..{self.family.k - 1}, got {int(flips.max())}")
        return flips.to(torch.uint8)

    def _shift_colours(self, shifts: torch.Tensor) -> None:
        """Noise: add `shifts` (0..k-1 per cell) to the tapes mod k (XOR for two colours)."""
        if self.family.k == 2:
            self.tapes.bitwise_xor_(shifts)
        else:
            moved = self.tapes + shifts
            self.tapes.copy_(torch.where(moved >= self.family.k, moved - self.family.k, moved))

    def step(self, actions: torch.Tensor, flips=None):
        """One step of every row. `flips` ((N, L), optional) is an explicit noise realisation added to the tapes
        mod k after the CA update (0/1 for two colours, shifts 0..k-1 for k > 2: evaluation's common-random-number
        noise, `evaluation.episodes.noise_flips`); it needs an env without noise of its own."""
        actions = self._check_actions(actions)
        if flips is not None:
            flips = self._check_flips(flips)
        if self.family.elementary:
            torch_kernel.flip_padded_(self._padded, actions, self._row_offsets)
            torch_kernel.step_padded_(self._padded, self._plane, self._scratch)
        else:
            k, r = self.family.k, self.family.r
            torch_table_kernel.increment_padded_(self._padded, actions, self._row_offsets, k)
            torch_table_kernel.step_padded_(self._padded, self._tables, k, r, self._table_scratch)
        if flips is None and self._noisy:
            uniform = torch.rand(self.num_envs, self.L, generator=self.generator)
            flips = (uniform < self.row_noise.unsqueeze(1)).to(torch.uint8)
            if self.family.k > 2:   # a noisy cell moves to a uniformly random other colour
                flips *= torch.randint(1, self.family.k, (self.num_envs, self.L), generator=self.generator,
                                       dtype=torch.uint8)
            flips = flips.to(self.device)
        if flips is not None:
            self._shift_colours(flips)
        self.t += 1
        obs = self.observation()
        if self._row_goals is not None:
            dist = goal_distances(self.tapes, self._row_goals)
        else:
            if self.family.k == 2:
                mismatches = torch.mv(obs[:, :self.L], self._goal_sign)
                if self._goal_ones:
                    mismatches += self._goal_ones
            else:
                mismatches = (self.tapes != self.goal).sum(dim=1).to(torch.float32)
            dist = mismatches.div_(self.L)
        reward, terminated, truncated = step_outcomes(dist, self.t, self.H, self.success_bonus)
        info = {"dist": dist, "rule": self.rules.clone(), "t": self.t.clone()}
        if self.autoreset:
            info["final_obs"] = obs
            done_rows = (terminated | truncated).nonzero().squeeze(1)
            if done_rows.numel():
                self._reset_rows(done_rows)
                obs = obs.clone()
                obs[done_rows, :self.L] = self.tapes[done_rows].float()
                if self.goal_in_obs:
                    obs[done_rows, self.L:2 * self.L] = self.row_goals()[done_rows].float()
                obs[done_rows, -1] = 0.0
        return obs, reward, terminated, truncated, info


class StackedEnvs:
    """S elementary `BatchedTapeEnv`s of n rows each (same L, H, goal, success bonus, CPU) stepped as one: a seed
    block's training environments (docs/protocol.md#seed-blocks).

    Stepped one by one, a block's S envs cost S streams of small tensor operations per block step, which is most of a
    stacked block's time on a GPU (the environments run on the CPU). This keeps every seed's env object and random
    stream but moves their state into one buffer of S x n rows: each env's tensors become views of its n rows, so the
    CA update, observation and outcomes of all seeds run as one batch, and a seed's resets still run through its own
    env (its own generator, in the order its one-seed run draws). Every operation of a step works row by row (the
    distance is a sum of 0/1 cells, exact in any order), so each seed's rows get the bits its env alone would give.

    `StackedEnvs.of(envs)` returns None for envs it does not cover (another env class, rule families beyond the
    elementary, goals in the observation, per-row goals, no auto-reset); the caller then steps the envs one by one.
    """

    @classmethod
    def of(cls, envs: list) -> "StackedEnvs | None":
        """The stacked form of `envs`, or None where they cannot share one buffer."""
        first = envs[0] if envs else None
        if first is None or any(type(env) is not BatchedTapeEnv for env in envs):
            return None
        for env in envs:
            if (not env.family.elementary or not env.autoreset or env.goal_in_obs or env.goal_sampler is not None
                    or env._row_goals is not None or env.device.type != "cpu"):
                return None
            if (env.num_envs, env.L, env.H, env.success_bonus) != (first.num_envs, first.L, first.H,
                                                                    first.success_bonus):
                return None
            if not torch.equal(env.goal, first.goal):
                return None
        return cls(envs)

    def __init__(self, envs: list[BatchedTapeEnv]):
        self.envs = envs
        first = envs[0]
        self.S, self.n, self.L, self.H = len(envs), first.num_envs, first.L, first.H
        self.success_bonus = first.success_bonus
        self._goal_sign, self._goal_ones = first._goal_sign, first._goal_ones
        self._noisy = any(env._noisy for env in envs)
        rows = self.S * self.n
        self._padded = torch.cat([env._padded for env in envs])
        self._plane = torch.cat([env._plane for env in envs])
        self._scratch = torch.empty(rows, self.L, dtype=torch.uint8)
        self._row_offsets = torch_kernel.flat_row_offsets(rows, self.L)
        rules = torch.cat([env.rules for env in envs])
        self.t = torch.cat([env.t for env in envs])
        for k, env in enumerate(envs):   # from here on each env's state is its rows of the stacked buffers
            own = slice(k * self.n, (k + 1) * self.n)
            env._padded, env._plane, env._scratch = self._padded[own], self._plane[own], self._scratch[own]
            env.rules, env.t = rules[own], self.t[own]

    @property
    def tapes(self) -> torch.Tensor:
        return torch_kernel.interior(self._padded)

    def observation(self) -> torch.Tensor:
        """(S, n, L + 1): every seed's `env.observation()`."""
        obs = torch.empty(self.S * self.n, self.L + 1, dtype=torch.float32)
        obs[:, :self.L] = self.tapes
        torch.div(self.t, self.H, out=obs[:, -1])
        return obs.view(self.S, self.n, -1)

    def _check_actions(self, actions) -> torch.Tensor:
        actions = torch.as_tensor(actions)
        if actions.shape != (self.S, self.n):
            raise ValueError(f"actions must have shape ({self.S}, {self.n}), got {tuple(actions.shape)}")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ValueError(f"actions must be integer cell indices in 0..{self.L - 1}, got dtype {actions.dtype}")
        low, high = (int(v) for v in torch.aminmax(actions))
        if low < 0 or high >= self.L:
            raise ValueError(f"actions must be cell indices in 0..{self.L - 1}, got range {low}..{high}")
        return actions.reshape(-1).long()

    def step(self, actions):
        """actions (S, n) -> (obs, reward, terminated, truncated, final_obs), each (S, n, ...): seed k's slice is
        what `envs[k].step(actions[k])` returns (final_obs is its info["final_obs"])."""
        actions = self._check_actions(actions)
        torch_kernel.flip_padded_(self._padded, actions, self._row_offsets)
        torch_kernel.step_padded_(self._padded, self._plane, self._scratch)
        if self._noisy:   # each seed's noise from its own generator, as its env draws it
            flips = torch.cat([(torch.rand(env.num_envs, self.L, generator=env.generator)
                                < env.row_noise.unsqueeze(1)).to(torch.uint8) if env._noisy
                               else torch.zeros(env.num_envs, self.L, dtype=torch.uint8) for env in self.envs])
            self.tapes.bitwise_xor_(flips)
        self.t += 1
        obs = self.observation().view(self.S * self.n, -1)
        mismatches = torch.mv(obs[:, :self.L], self._goal_sign)
        if self._goal_ones:
            mismatches += self._goal_ones
        reward, terminated, truncated = step_outcomes(mismatches.div_(self.L), self.t, self.H, self.success_bonus)
        final_obs = obs
        done = terminated | truncated
        if bool(done.any()):
            obs = obs.clone()
            done_rows = done.view(self.S, self.n)
            for k, env in enumerate(self.envs):
                rows = done_rows[k].nonzero().squeeze(1)
                if rows.numel():
                    env._reset_rows(rows)
            rows = done.nonzero().squeeze(1)
            obs[rows, :self.L] = self.tapes[rows].float()
            obs[rows, -1] = 0.0
        shape = (self.S, self.n)
        return (obs.view(*shape, -1), reward.view(shape), terminated.view(shape), truncated.view(shape),
                final_obs.view(*shape, -1))


def seed_block_step(envs: list):
    """The step of a seed block's envs, one per seed: actions (S, n) -> (obs, reward, terminated, truncated,
    final_obs), each (S, n, ...), seed k's slice what `envs[k].step(actions[k])` returns. `StackedEnvs` where it
    covers the envs, else each env in turn (any env with the batched step contract, the grid's too)."""
    stacked = StackedEnvs.of(envs)
    if stacked is not None:
        return stacked.step

    def one_by_one(actions):
        steps = [env.step(actions[k]) for k, env in enumerate(envs)]
        return (*(torch.stack([s[i] for s in steps]) for i in range(4)),
                torch.stack([s[4]["final_obs"] for s in steps]))
    return one_by_one


def _constant_if_degenerate(value):
    if isinstance(value, tuple) and value[0] == value[1]:
        return value[0]
    return value


def _low(value) -> float:
    return value[0] if isinstance(value, tuple) else value
