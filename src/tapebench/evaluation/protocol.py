"""The evaluation protocol: one object that fixes which episodes a method plays and how they are scored.

`EvalProtocol` holds L, H, split name and content hash, side, rule list, episodes per rule, evaluation
seed, goal, success bonus and the cell-update noise epsilon (docs/protocol.md#noise; recorded only when > 0,
so a noise-free protocol's provenance names no noise). Its episodes are the common-random-number evaluation episodes of
`evaluation.episodes.episode_set`, so every method — learned agents, planners, the oracles and the
random floor — plays exactly the same episodes. Every evaluation file records its protocol in the
Parquet provenance under "protocol", so `oracle.normalized` can refuse to compare across protocols.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tapebench.defaults import EPISODES_PER_RULE, EVAL_SEED
from tapebench.defaults import GOAL, GOAL_STEPS, NOISE, SUCCESS_BONUS
from tapebench.episodes.sets import EpisodeSet, episode_set
from tapebench.episodes.streams import split_key
from tapebench.rule_family import ELEMENTARY
from tapebench.rules.features import read_features
from tapebench.splits.io import DEFAULT_SPLITS_DIR, Split, resolve_split
from tapebench.utils.artifacts import read_table
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import check_goal, check_horizon, check_length, check_noise, check_rules
from tapebench.vocabulary import DERIVED_GOAL, SPLIT_SIDES

PROTOCOL_FIELDS = ("L", "H", "split", "split_hash", "side", "rules", "episodes_per_rule", "eval_seed",
                   "goal", "success_bonus", "noise", "goal_mode", "goal_steps")
# fields a protocol record leaves out at their default (goal_steps too whenever the goal is not derived)
FIELD_DEFAULTS = {"noise": NOISE, "goal_mode": GOAL, "goal_steps": GOAL_STEPS}


@dataclass(frozen=True)
class EvalProtocol:
    """Everything that fixes an evaluation's episodes and their scoring."""

    L: int
    H: int
    split: str                 # split name, "" for an explicit rule list
    split_hash: str            # split content hash, "" for an explicit rule list
    side: str                  # "train" / "test" for a split, "rules" for an explicit list
    rules: tuple[int, ...]
    episodes_per_rule: int
    eval_seed: int
    goal: str = ""             # goal tape as a 0/1 string; "" = all zeros (the default goal)
    success_bonus: float = SUCCESS_BONUS
    noise: float = NOISE         # cell-update noise epsilon of the dynamics (docs/protocol.md#noise)
    goal_mode: str = GOAL        # "zeros": `goal` for every episode; "derived": a goal per episode (#multi-goal)
    goal_steps: int = GOAL_STEPS   # derived goals: at most this many random steps from the start

    def as_dict(self) -> dict:
        out = asdict(self)
        out["rules"] = list(self.rules)
        if self.goal_mode != DERIVED_GOAL:
            del out["goal_steps"]
        for name, default in FIELD_DEFAULTS.items():
            if name in out and out[name] == default:
                del out[name]
        return out

    def goal_tape(self) -> np.ndarray:
        if not self.goal:
            return np.zeros(self.L, dtype=np.uint8)
        return check_goal(np.array([int(c) for c in self.goal], dtype=np.uint8), self.L)


def goal_string(goal, L: int) -> str:
    """'' for the default all-zero goal, else the goal's cells as a 0/1 string."""
    goal = check_goal(goal, L)
    return "" if not goal.any() else "".join(str(int(c)) for c in goal)


def protocol_episodes(*, L: int, H: int, episodes_per_rule: int, eval_seed: int = 0, split=None,
                      side: str | None = None, rules=None, features=None, goal=None,
                      success_bonus: float = SUCCESS_BONUS, noise: float = NOISE, splits_dir=DEFAULT_SPLITS_DIR,
                      goal_mode: str = GOAL, goal_steps: int = GOAL_STEPS, family=None
                      ) -> tuple[EpisodeSet, EvalProtocol, dict[int, str]]:
    """Build the evaluation episodes of one side of a split, or of an explicit rule list.

    Exactly one of `split` (a Split, a name or a path, with `side` one of its sides: 'train', 'test', or a
    ladder level 'd1', 'd2', ...) and `rules` must be given. `noise` > 0 makes the dynamics stochastic with the
    episodes' common noise realisation. `goal_mode` "derived" gives each episode its own goal (docs/protocol.md#multi-goal).
    Rule types come from the split; for a rule list from the features file `features` if given. `family`: the rule
    family of a rule list (None: elementary); a split names its own.
    Returns (episodes, protocol, {rule: type}).
    """
    L, H = check_length(L), check_horizon(H)
    if isinstance(episodes_per_rule, bool) or int(episodes_per_rule) < 1:
        raise ValueError(f"episodes per rule must be an integer >= 1, got {episodes_per_rule!r}")
    goal_text = goal_string(goal, L)
    noise = float(check_noise(noise))
    if (split is None) == (rules is None):
        raise ValueError("give either a split (with --side train|test) or an explicit rule list (--rules), not "
                         f"{'both' if split is not None else 'neither'}")
    if split is not None and family is not None:
        raise ValueError("a split names its own rule family; `family` is for an explicit rule list")
    if split is not None:
        sp = split if isinstance(split, Split) else resolve_split(split, splits_dir)
        if side not in (*SPLIT_SIDES, *sp.sides):
            raise ValueError(f"side must be one of {list(dict.fromkeys((*SPLIT_SIDES, *sp.sides)))} for split "
                             f"{sp.name!r}, got {side!r}")
        rule_list = list(sp.side_rules(side))
        types = {int(z): sp.types.get(int(z), "") for z in rule_list}
        name, chash, key = sp.name, sp.content_hash, split_key(sp.content_hash)
        family = sp.family
    else:
        if side not in (None, "rules"):
            raise ValueError(f"an explicit rule list is evaluated on side 'rules', got side {side!r}")
        side = "rules"
        family = ELEMENTARY if family is None else family
        rule_list = check_rules(rules, family)
        types = rule_types_from_features(features, rule_list) if features else {}
        name, chash, key = "", "", 0
    episodes = episode_set(rule_list, int(episodes_per_rule), L, eval_seed=int(eval_seed), key=key, side=side,
                           goal=goal, family=family, noise=noise, goal_mode=goal_mode, goal_steps=goal_steps)
    protocol = EvalProtocol(L=L, H=H, split=name, split_hash=chash, side=side, rules=tuple(int(z) for z in rule_list),
                        episodes_per_rule=int(episodes_per_rule), eval_seed=int(eval_seed), goal=goal_text,
                        success_bonus=float(success_bonus), noise=noise, goal_mode=goal_mode,
                        goal_steps=int(goal_steps))
    return episodes, protocol, types


def rule_types_from_features(path, rules) -> dict[int, str]:
    frame, _ = read_features(path)
    types = dict(zip(frame["rule"].astype(int), frame["type"].astype(str)))
    missing = [z for z in rules if z not in types]
    if missing:
        raise ValueError(f"features file {path} has no type for rules {missing}")
    return {int(z): types[int(z)] for z in rules}


def write_records(path, frame: pd.DataFrame, protocol: EvalProtocol, *, oracle: str, planner: dict,
                  seed: int | None) -> None:
    """Write per-episode oracle records with the protocol and planner settings in the provenance."""
    config = {"oracle": oracle, "planner": planner, "protocol": protocol.as_dict()}
    write_parquet(path, frame, meta=provenance(config, seed, oracle=oracle, protocol=protocol.as_dict()))


def read_records(path) -> tuple[pd.DataFrame, dict]:
    """Read oracle records; returns (frame, provenance). Raises if the file lacks a protocol record."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"oracle records not found: {path}")

    frame, meta = read_table(path, "records")
    if "protocol" not in meta:
        raise ValueError(f"{path} records no evaluation protocol in its provenance; "
                         f"it was not written by `tapebench mpc` / `tapebench exact`")
    return frame, meta


def protocol_differences(a: dict, b: dict, fields=PROTOCOL_FIELDS) -> list[str]:
    """Human-readable list of the protocol fields where `a` and `b` differ (empty if they match)."""
    diffs = []
    for f in fields:
        va, vb = a.get(f, FIELD_DEFAULTS.get(f)), b.get(f, FIELD_DEFAULTS.get(f))
        if f == "rules" and va is not None and vb is not None:
            va, vb = sorted(int(x) for x in va), sorted(int(x) for x in vb)
            if va != vb:
                diffs.append(f"rules ({len(va)} vs {len(vb)} rules; only in one: "
                             f"{sorted(set(va) ^ set(vb))[:10]})")
            continue
        if va != vb:
            diffs.append(f"{f} ({va!r} vs {vb!r})")
    return diffs
