"""Play an oracle (random-shooting MPC or the exact optimum) on a protocol's episodes -> records."""
from __future__ import annotations

import pandas as pd

from ..evaluation.episodes import EpisodeSet
from ..evaluation.runner import episode_frame
from .exact import check_exact_horizon, check_exact_length, run_exact
from .mpc import MPCConfig, run_mpc
from .protocol import Protocol, protocol_episodes, write_records

ORACLES = ("mpc", "exact")


def play(oracle: str, episodes: EpisodeSet, protocol: Protocol, rule_types: dict[int, str],
         mpc: MPCConfig | None = None) -> pd.DataFrame:
    """Per-episode records (schema `evaluation.records`) of one oracle on the protocol's episodes."""
    goal = protocol.goal_tape()
    if oracle == "mpc":
        results = run_mpc(episodes, protocol.H, mpc or MPCConfig(), eval_seed=protocol.eval_seed, goal=goal,
                          success_bonus=protocol.success_bonus)
    elif oracle == "exact":
        results = run_exact(episodes, protocol.H, goal=goal, success_bonus=protocol.success_bonus)
    else:
        raise ValueError(f"unknown oracle {oracle!r}; choose one of {list(ORACLES)}")
    return episode_frame(results, episodes, H=protocol.H, split=protocol.split, rule_types=rule_types)


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
