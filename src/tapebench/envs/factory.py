"""The batched environment of a rule family: `BatchedTapeEnv` for tapes, `BatchedGridEnv` for the 2D grid
family (docs/protocol.md#grid). The evaluation runner and the training loop build their environment here, so a
run or an evaluation on the grid differs from one on tapes only by its family; a grid of side n has L = n * n
cells (`validation.grid_side`)."""
from __future__ import annotations

import numpy as np

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.grid_rules import GridFamily
from tapebench.validation import grid_side


def is_grid(family) -> bool:
    return isinstance(family, GridFamily)


def batched_env(num_envs: int, *, L: int, H: int, rules, family, success_bonus: float, device, seed: int = 0,
                autoreset: bool = True, **tape_options):
    """A batched env of `family` (`rule_family.RuleFamily` or `grid_rules.GridFamily`) on `rules`.
    `tape_options` (a goal, goals in the observation, domain randomisation, ...) are `BatchedTapeEnv`'s; the grid
    env has the all-zero goal only and refuses any of them by name."""
    if is_grid(family):
        given = sorted(k for k, v in tape_options.items() if not _unset(k, v))
        if given:
            raise ValueError(f"the {family.name} grid environment has the all-zero goal and no domain randomisation; "
                             f"it takes none of {given}")
        return BatchedGridEnv(num_envs, n=grid_side(L), H=H, rules=rules, neighbourhood=family.name,
                              success_bonus=success_bonus, device=device, seed=seed, autoreset=autoreset)
    return BatchedTapeEnv(num_envs, L=L, H=H, rules=rules, success_bonus=success_bonus, device=device, seed=seed,
                          autoreset=autoreset, family=family, **tape_options)


def _unset(key: str, value) -> bool:
    """A tape option left at what the grid has anyway: nothing, off, or the all-zero goal."""
    if value is None or value is False:
        return True
    return key == "goal" and not np.asarray(value).any()
