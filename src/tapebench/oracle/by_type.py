"""`mpc_by_type_eval.json` (docs/protocol.md#oracle, paper App. I / Table 7): MPC strict success by rule type.

JSON layout:
  {"by_type": {"stable": {"success", "mean_return", "n_episodes", "n_rules"}, "periodic": ..., "chaotic": ...},
   "all": {...same fields...},
   "protocol": {L, H, split, split_hash, side, rules, episodes_per_rule, eval_seed, goal, success_bonus},
   "planner": {kind, horizon, candidates, seed},
   "provenance": {code_version, config, seed, ...}}
A type with no episodes has n_episodes 0 and null success / mean_return. Types other than the three
canonical ones (e.g. "" when a rule has no type) are listed after them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tapebench import defaults
from tapebench.evaluation.protocol import protocol_episodes
from tapebench.methods.mpc import MPCConfig
from tapebench.oracle.gap import TYPE_ORDER
from tapebench.oracle.run import planner_settings, play
from tapebench.utils.artifacts import read_json
from tapebench.utils.io import provenance, write_json


def _bucket(rows: pd.DataFrame) -> dict:
    n = int(len(rows))
    return {"success": float(rows["success"].mean()) if n else None,
            "mean_return": float(rows["return"].mean()) if n else None,
            "n_episodes": n, "n_rules": int(rows["rule"].nunique())}


def by_type_summary(records: pd.DataFrame) -> dict:
    """Per-type and overall strict success / mean return / episode counts of per-episode records."""
    types = list(TYPE_ORDER) + sorted(set(records["type"].astype(str)) - set(TYPE_ORDER))
    return {"by_type": {t: _bucket(records[records["type"].astype(str) == t]) for t in types},
            "all": _bucket(records)}


def export_mpc_by_type(out, *, split, side: str, episodes_per_rule: int = defaults.BY_TYPE_EPISODES_PER_RULE,
                       L: int = defaults.L, H: int = defaults.H,
                       eval_seed: int = 0, mpc: MPCConfig | None = None, splits_dir=None) -> dict:
    """Run MPC on one side of a split and write the by-type JSON; returns what was written."""
    mpc = mpc or MPCConfig()
    kwargs = {"splits_dir": splits_dir} if splits_dir is not None else {}
    episodes, protocol, types = protocol_episodes(L=L, H=H, episodes_per_rule=episodes_per_rule,
                                                  eval_seed=eval_seed, split=split, side=side, **kwargs)
    records = play("mpc", episodes, protocol, types, mpc)
    planner = planner_settings("mpc", mpc)
    payload = {**by_type_summary(records), "protocol": protocol.as_dict(), "planner": planner,
               "provenance": provenance({"planner": planner, "protocol": protocol.as_dict()}, mpc.seed,
                                        oracle="mpc")}
    write_json(out, payload)
    return payload


def read_by_type(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"by-type export not found: {path} (written by `tapebench export-mpc-by-type`)")
    payload = read_json(path, "by-type export", writer="tapebench export-mpc-by-type")
    missing = [k for k in ("by_type", "all", "protocol") if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise ValueError(f"{path} is not a by-type export: missing {missing}")
    return payload
