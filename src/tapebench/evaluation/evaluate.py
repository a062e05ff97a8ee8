"""Evaluate any method on a protocol's common-random-number episodes -> per-episode records.

`play` is the one place where a method's evaluation policy meets the episodes: it applies what the
method is allowed to see (true rules only for reference methods) and how it is batched. Trained
agents go through it once per checkpoint (`evaluation.trained_runs`), methods that do not train once per
seed (`evaluate_untrained`), the oracle commands once (`oracle.run`). `write_evaluation` writes either's records;
`greedy_success` is one agent's strict success on a rule list.
"""
from __future__ import annotations

import dataclasses
import time

import pandas as pd
import torch

from tapebench import defaults
from tapebench.episodes.sets import EpisodeSet, episode_set
from tapebench.evaluation.protocol import EvalProtocol, protocol_episodes
from tapebench.evaluation.records import coerce_episode_frame
from tapebench.evaluation.runner import episode_frame, run_episodes
from tapebench.methods.contract import greedy_policy
from tapebench.registry import Method, PolicyContext, build_config, check_rule_family, get_method
from tapebench.splits.io import Split, resolve_split
from tapebench.utils.io import provenance, write_parquet


def side_protocols(*, L: int, H: int, episodes_per_rule: int, eval_seed: int,
                   success_bonus: float = defaults.SUCCESS_BONUS, noise: float = defaults.NOISE, split=None, rules=None,
                   features=None, goal_mode: str = defaults.GOAL, goal_steps: int = defaults.GOAL_STEPS, family=None
                   ) -> list[tuple[EpisodeSet, EvalProtocol, dict[int, str]]]:
    """The ID ('train') and OOD protocols of a split ('test', or one per level 'd1', 'd2', ... of a severity
    ladder), or the one protocol of a rule list (of `family`; None: elementary)."""
    common = dict(L=L, H=H, episodes_per_rule=episodes_per_rule, eval_seed=eval_seed, success_bonus=success_bonus,
                  noise=noise, goal_mode=goal_mode, goal_steps=goal_steps)
    if split is not None:
        split = split if isinstance(split, Split) else resolve_split(split)
        return [protocol_episodes(split=split, side=side, **common) for side in split.sides]
    return [protocol_episodes(rules=rules, features=features, family=family, **common)]


def play(policy, method: Method, episodes: EpisodeSet, protocol: EvalProtocol, rule_types: dict[int, str],
         device="cpu") -> pd.DataFrame:
    """Per-episode records (schema `evaluation.records`) of one method's policy on the protocol's episodes."""
    check_rule_family(method.id, episodes.family)
    if episodes.goals is not None and not method.goal_conditioned:
        raise ValueError(f"method {method.id!r} does not take an episode's goal, so it cannot play the multi-goal "
                         f"protocol (env.goal: derived, docs/protocol.md#multi-goal)")
    results = run_episodes(policy, episodes, protocol.H, goal=protocol.goal_tape(),
                           success_bonus=protocol.success_bonus, device=device,
                           reveal_rules=method.sees_true_rule, by_rule=method.by_rule, who=f"method {method.id!r}")
    return episode_frame(results, episodes, H=protocol.H, split=protocol.split, rule_types=rule_types)


def with_run_columns(frame: pd.DataFrame, method_id: str, seed: int, checkpoint: int) -> pd.DataFrame:
    frame.insert(0, "checkpoint", int(checkpoint))
    frame.insert(0, "seed", int(seed))
    frame.insert(0, "agent", method_id)
    return frame


def evaluate_untrained(method_id: str, hyperparameters: dict | None, seed: int, sides, *, train_rules=(),
                       device="cpu", log=None) -> tuple[pd.DataFrame, dict]:
    """Evaluate a method that does not train (seed = its random stream) on each (episodes, protocol, types).

    Returns (records with agent/seed/checkpoint columns, checkpoint 0, and a summary for the provenance).
    """
    method = get_method(method_id)
    if method.trains:
        raise ValueError(f"method {method_id!r} trains: evaluate its run directory (tapebench evaluate --run)")
    if method.make_policy is None:
        raise ValueError(f"method {method_id!r} takes part in the world test only (`tapebench worldtest`); it has "
                         f"no evaluation policy for TAPE episodes")
    config = build_config(method_id, hyperparameters)
    frames, start, cpu_start = [], time.perf_counter(), time.process_time()
    device = torch.device(device)
    for episodes, protocol, types in sides:
        check_rule_family(method_id, episodes.family)
        context = PolicyContext(L=protocol.L, H=protocol.H, seed=int(seed), train_rules=tuple(train_rules),
                                device=device, family=episodes.family)
        side_start = time.perf_counter()
        frame = play(method.policy_maker(episodes.family)(config, context), method, episodes, protocol, types, device)
        frames.append(with_run_columns(frame, method_id, seed, 0))
        if log is not None:
            log(f"{method_id} seed {seed}, side {protocol.side}: strict success {frame['success'].mean():.3f} "
                f"over {len(frame)} episodes ({time.perf_counter() - side_start:.1f} s)")
    records = coerce_episode_frame(pd.concat(frames, ignore_index=True), with_agent=True)
    summary = {"checkpoints": [0], "H": int(sides[0][1].H), "episodes_per_rule": int(sides[0][1].episodes_per_rule),
               "eval_seed": int(sides[0][1].eval_seed), "seconds": round(time.perf_counter() - start, 3),
               "cpu_seconds": round(time.process_time() - cpu_start, 3),
               "method": {"id": method_id, "seed": int(seed), "hyperparameters": dataclasses.asdict(config)},
               "protocols": [p.as_dict() for _, p, _ in sides]}
    return records, summary


def write_evaluation(out, records: pd.DataFrame, summary: dict, config_slice: dict, seed: int, split=None) -> None:
    split_info = {"name": split.name, "content_hash": split.content_hash} if split is not None else None
    write_parquet(out, records, meta=provenance(config_slice, seed, split=split_info, evaluation=summary))


def greedy_success(agent, rules, H: int, L: int, episodes_per_rule: int = 100, eval_seed: int = 0,
                   device="cpu") -> float:
    """Strict success of an agent's evaluation policy on CRN episodes of `rules` (side "rules")."""
    episodes = episode_set(rules, episodes_per_rule, L, eval_seed=eval_seed, side="rules")
    with torch.no_grad():
        results = run_episodes(greedy_policy(agent), episodes, H, device=device)
    return float(results["success"].mean())
