"""Argument checks shared by every entry point: each error names the bad value and what is allowed."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.vocabulary import GOAL_MODES, MAX_GOAL_STEPS

MIN_L, MAX_L = 3, 64
MIN_GRID, MAX_GRID = 3, 32    # side n of the n x n torus grids (docs/protocol.md#grid)
NUM_RULES = 256
MAX_SEED = 2**32 - 1          # every seed of the config (workflow/schemas/config.schema.yaml) and of the CLI
MAX_SUCCESS_BONUS = 1000.0    # the protocol's env.success_bonus is in 0..MAX_SUCCESS_BONUS (config and --params)


def seed_argument(text: str) -> int:
    """argparse type of every `--seed`: an integer in 0..MAX_SEED."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..{MAX_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..{MAX_SEED}, got {text}")
    return value


def check_integer(value, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer (not a bool) in minimum..maximum; the error names `name` and the allowed range."""
    allowed = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")
    return int(value)


def check_rule(rule, family=None) -> int:
    """A rule of `family` (default the elementary family, 0..255) as a Python int."""
    return _family(family).check_rule(rule)


def check_rules(rules, family=None) -> list[int]:
    """A non-empty collection of rules of `family` (default elementary) as a list of Python ints."""
    return _family(family).check_rules(rules)


def _family(family):
    return ELEMENTARY if family is None else family


def resolve_family(family=None, k=None, r=None):
    """The rule family of an entry point that accepts `family=` or `k=`, `r=` (default elementary)."""
    if family is None:
        return RuleFamily(ELEMENTARY.k if k is None else k, ELEMENTARY.r if r is None else r)
    if not isinstance(family, RuleFamily):
        raise ValueError(f"family must be a RuleFamily, got {family!r}")
    if (k is not None and k != family.k) or (r is not None and r != family.r):
        raise ValueError(f"family k = {family.k}, r = {family.r} contradicts k = {k}, r = {r}; give one of them")
    return family


def check_length(L) -> int:
    if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)):
        raise ValueError(f"tape length L must be an integer in {MIN_L}..{MAX_L}, got {L!r}")
    if not MIN_L <= int(L) <= MAX_L:
        raise ValueError(f"tape length L must be in {MIN_L}..{MAX_L}, got {L}")
    return int(L)


def check_grid_size(n) -> int:
    """The side n of an n x n torus grid, MIN_GRID..MAX_GRID."""
    return check_integer(n, "grid side n", MIN_GRID, MAX_GRID)


def grid_side(L) -> int:
    """The side n of a grid of L = n * n cells (a grid's episodes, runs and policies carry L like a tape's)."""
    L = check_length(L)
    n = math.isqrt(L)
    if n * n != L:
        raise ValueError(f"a grid of L = {L} cells is not square; a grid of side n has L = n * n cells")
    return check_grid_size(n)


def check_horizon(H) -> int:
    if isinstance(H, (bool, np.bool_)) or not isinstance(H, (int, np.integer)):
        raise ValueError(f"horizon H must be an integer >= 1, got {H!r}")
    if int(H) < 1:
        raise ValueError(f"horizon H must be >= 1, got {H}")
    return int(H)


def check_goal(goal, L: int, what: str = "goal tape", family=None) -> np.ndarray:
    """Return the goal tape as uint8 (default all zeros when goal is None); cells 0/1, or 0..k-1 for a
    family with k colours."""
    if goal is None:
        return np.zeros(L, dtype=np.uint8)
    arr = np.asarray(goal)
    if arr.ndim != 1 or arr.shape[0] != L:
        raise ValueError(f"{what} must have length L={L}, got shape {arr.shape}")
    if family is not None and family.k != 2:
        return family.check_cells(arr, what=what)
    if arr.dtype.kind not in "biuf" or not np.all((arr == 0) | (arr == 1)):
        bad = sorted(set(np.unique(arr).tolist()) - {0, 1})
        raise ValueError(f"{what} cells must be 0 or 1, got values {bad}")
    return arr.astype(np.uint8)


def check_action(action, L: int) -> int:
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
        raise ValueError(f"action must be an integer cell index in 0..{L - 1}, got {action!r}")
    if not 0 <= int(action) < L:
        raise ValueError(f"action must be a cell index in 0..{L - 1}, got {action}")
    return int(action)


def check_success_bonus(bonus) -> float:
    """The success bonus b of the reward: any finite real number."""
    if isinstance(bonus, (bool, np.bool_)) or not isinstance(bonus, (int, float, np.integer, np.floating)) \
            or not np.isfinite(bonus):
        raise ValueError(f"success_bonus must be a finite number, got {bonus!r}")
    return float(bonus)


def check_env_params(env: dict, where: str = "--params section 'env'") -> dict:
    """A job's env slice ({L, H, success_bonus}) with the bounds the config's `env` section has."""
    checked = {}
    for key, check in (("L", check_length), ("H", check_horizon), ("success_bonus", check_success_bonus)):
        if key in env:
            try:
                checked[key] = check(env[key])
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
    bonus = checked.get("success_bonus", 0.0)
    if not 0.0 <= bonus <= MAX_SUCCESS_BONUS:
        raise ValueError(f"{where}: success_bonus must be in 0..{MAX_SUCCESS_BONUS:g} (as config env.success_bonus), "
                         f"got {bonus}")
    return {**env, **checked}


def check_output_file(path, option: str) -> None:
    """An output path that a command can write once its work is done: not a folder, its parent not a file.
    Checked before any measurement or run, so that the work is not lost at the end."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path inside it")
    parent = next((q for q in path.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a folder")


def refuse_duplicates(paths, what: str) -> list[Path]:
    """The input files of an aggregate, each once: a file given twice (under any spelling of its path) would
    count its records twice."""
    paths = [Path(p) for p in paths]
    seen: dict[Path, Path] = {}
    for p in paths:
        key = p.resolve()
        if key in seen:
            raise ValueError(f"{what} file given twice: {seen[key]} and {p} (each input is counted once; "
                             f"remove the repeat)")
        seen[key] = p
    return paths


def check_finite_values(value, key: str) -> None:
    """Every number in a parsed JSON value is finite; the error names the key path (JSON allows NaN, Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key}: {value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite_values(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite_values(v, f"{key}[{i}]")


def as_scalar_action(action):
    """Unwrap a 0-d numpy array or one-element torch tensor to a Python scalar (other values pass)."""
    if isinstance(action, np.ndarray) and action.ndim == 0:
        return action.item()
    if type(action).__module__ == "torch" and hasattr(action, "numel") and action.numel() == 1 \
            and action.dim() == 0:
        return action.item()
    return action


def parse_rule_list(text: str) -> list[int]:
    """Parse '0-255', '30,110', '0-3,90' into a sorted list of unique rules."""
    return sorted(check_rules(_parse_ranges(text, "rule list", "'0-255' or '30,110'")))


def parse_seed_list(text: str) -> list[int]:
    """Parse '0-3', '0,5,7' into a sorted list of unique seeds (integers >= 0)."""
    seeds = _parse_ranges(text, "seed list", "'0-3' or '0,5,7'")
    if not seeds:
        raise ValueError(f"the seed list {text!r} names no seed; use e.g. '0-3' or '0,5,7'")
    for seed in seeds:
        check_integer(seed, "seed", minimum=0, maximum=MAX_SEED)
    return seeds


def _parse_ranges(text: str, what: str, example: str) -> list[int]:
    values: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                values.update(range(lo, hi + 1))
            else:
                values.add(int(part))
        except ValueError:
            raise ValueError(f"cannot parse {what} item {part!r} in {text!r}; use e.g. {example}") from None
    return sorted(values)


MAX_NOISE = 0.5


def _check_nuisance(value, name: str, low: float, high: float, low_open: bool, allow_range: bool):
    """A number in the interval, or (with `allow_range`) a (low, high) pair inside it with low <= high.
    Returns a float or a tuple of two floats."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if low_open else ']'}"
    allowed = f"a number in {interval}" + (f" or a (low, high) range inside {interval} with low <= high"
                                          if allow_range else "")

    def number(x) -> float:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
                or not np.isfinite(x):
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
        x = float(x)
        inside = (low < x < high) if low_open else (low <= x <= high)
        if not inside:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
        return x

    if isinstance(value, (tuple, list, np.ndarray)):
        if not allow_range or len(value) != 2:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
        lo, hi = number(value[0]), number(value[1])
        if lo > hi:
            raise ValueError(f"{name} range must have low <= high, got low {lo:g} > high {hi:g}")
        return (lo, hi)
    return number(value)


def check_init_density(value, allow_range: bool = False):
    """Initial cell density rho (cells i.i.d. Bernoulli(rho)): in (0, 1), so a tape other than the goal
    can always be drawn."""
    return _check_nuisance(value, "init_density", 0.0, 1.0, True, allow_range)


def check_goal_mode(goal, goal_steps) -> tuple[str, int]:
    """env.goal (zeros | derived) and env.goal_steps (1..MAX_GOAL_STEPS): docs/protocol.md#multi-goal."""
    if goal not in GOAL_MODES:
        raise ValueError(f"env.goal must be one of {list(GOAL_MODES)}, got {goal!r}")
    steps = check_integer(goal_steps, "env.goal_steps", minimum=1, maximum=MAX_GOAL_STEPS)
    return goal, steps


def check_noise(value, allow_range: bool = False):
    """Cell-update noise epsilon (each cell flips with probability epsilon after the CA update): in [0, 0.5]."""
    return _check_nuisance(value, "noise", 0.0, MAX_NOISE, False, allow_range)


def parse_param_sections(text: str, sections: dict) -> dict:
    """A job's `--params` JSON: an object of `sections`, each an object whose keys are among `sections[name]`
    (None: any key, checked elsewhere)."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--params is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(params, dict):
        raise ValueError(f"--params must be a JSON object with keys {sorted(sections)}, got {text!r}")
    for section, value in params.items():
        try:
            check_finite_values(value, section)
        except ValueError as exc:
            key, _, rest = str(exc).partition(": ")
            raise ValueError(f"--params key '{key}': {rest}") from None
    unknown = sorted(set(params) - set(sections))
    if unknown:
        raise ValueError(f"unknown --params section(s) {unknown}; allowed: {sorted(sections)}")
    for section, allowed in sections.items():
        value = params.get(section, {})
        if not isinstance(value, dict):
            raise ValueError(f"--params section {section!r} must be a JSON object, got {value!r}")
        if allowed is not None and set(value) - set(allowed):
            raise ValueError(f"unknown key(s) {sorted(set(value) - set(allowed))} in --params section "
                             f"{section!r}; allowed: {list(allowed)}")
    if "env" in sections:
        params["env"] = check_env_params(params.get("env", {}))
    return params
