"""Play an oracle (random-shooting MPC or the exact optimum) on a protocol's episodes -> records."""
from __future__ import annotations

import pandas as pd

from tapebench.episodes.sets import EpisodeSet
from tapebench.evaluation.evaluate import play as play_method
from tapebench.evaluation.protocol import EvalProtocol, protocol_episodes, write_records
from tapebench.methods.exact import ExactPolicy, check_exact_horizon, check_exact_length
from tapebench.grid_rules import GridFamily
from tapebench.methods.grid_mpc import GridMPCPolicy
from tapebench.methods.mpc import MPCConfig, MPCPolicy
from tapebench.registry import get_method

ORACLES = ("mpc", "exact")


def play(oracle: str, episodes: EpisodeSet, protocol: EvalProtocol, rule_types: dict[int, str],
         mpc: MPCConfig | None = None) -> pd.DataFrame:
    """Per-episode records (schema `evaluation.records`) of one oracle on the protocol's episodes, played
    through the evaluation runner like every other method."""
    if oracle == "mpc":
        planner = mpc or MPCConfig()
        grid = isinstance(episodes.family, GridFamily)
        policy = GridMPCPolicy(episodes.family, planner) if grid else MPCPolicy(planner)
    elif oracle == "exact":
        policy = ExactPolicy()
    else:
        raise ValueError(f"unknown oracle {oracle!r}; choose one of {list(ORACLES)}")
    return play_method(policy, get_method(oracle), episodes, protocol, rule_types)


def planner_settings(oracle: str, mpc: MPCConfig | None) -> dict:
    if oracle == "mpc":
        return {"kind": "random_shooting_mpc", **(mpc or MPCConfig()).as_dict()}
    return {"kind": "exact_dp", "tie_break": "fastest success, else least final distance; then lowest action"}


def evaluate_oracle(oracle: str, out, *, mpc: MPCConfig | None = None, **protocol_args) -> pd.DataFrame:
    """Build the protocol's episodes, play them with the oracle, write the records to `out`."""
    if oracle == "exact":   # fail on L / H before building any episodes
        check_exact_length(protocol_args["L"])
        check_exact_horizon(protocol_args["H"])
    episodes, protocol, types = protocol_episodes(**protocol_args)
    frame = play(oracle, episodes, protocol, types, mpc)
    seed = (mpc or MPCConfig()).seed if oracle == "mpc" else None
    write_records(out, frame, protocol, oracle=oracle, planner=planner_settings(oracle, mpc), seed=seed)
    return frame
