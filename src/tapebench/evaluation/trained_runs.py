"""Evaluation of a finished training run (docs/protocol.md#schedule, #decisions).

Every checkpoint of a run (or its last K) plays the greedy policy on the ID episodes (side "train",
the split's training rules) and the OOD episodes (side "test"), or on an explicit rule list
(side "rules"), at horizon H (`evaluate_run`). One record per episode (schema: `evaluation.records`) plus the
columns agent, seed and checkpoint (env steps trained). `model_error_run` measures the final checkpoint's world
model (`evaluation.model_error`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pandas as pd

from tapebench.defaults import EPISODES_PER_RULE, EVAL_SEED, GOAL, GOAL_STEPS, MODEL_ERROR_CONTEXT, MODEL_ERROR_DEPTH
from tapebench.evaluation.evaluate import play, side_protocols, with_run_columns
from tapebench.evaluation.model_error import check_probe, error_table, rollout_errors
from tapebench.evaluation.protocol import protocol_episodes
from tapebench.evaluation.records import coerce_episode_frame
from tapebench.methods.contract import greedy_policy
from tapebench.registry import get_method
from tapebench.rule_family import family_from_config
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import read_manifest, resolve_device, torch_settings
from tapebench.utils.artifacts import WrongKind, what_file_is
from tapebench.vocabulary import SPLIT_SIDES


def select_checkpoints(manifest: dict, last: int | str | None) -> list[dict]:
    checkpoints = manifest["checkpoints"]
    if last in (None, "all"):
        return checkpoints
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"evaluation.checkpoints must be 'all' or a positive integer K (the last K), got {last!r}")
    return checkpoints[-last:]


def evaluate_run(run_dir, H: int, *, split=None, rules=None, episodes_per_rule: int = EPISODES_PER_RULE,
                 eval_seed: int = EVAL_SEED, checkpoints: int | str | None = "all",
                 success_bonus: float = 1.0, noise: float = 0.0, L: int | None = None, device="cpu",
                 threads: int | None = 1, log=None, goal_mode: str = GOAL, goal_steps: int = GOAL_STEPS
                 ) -> tuple[pd.DataFrame, dict]:
    """Evaluate the run's checkpoints; returns (episode records, summary for the Parquet metadata).
    `noise` > 0: on the stochastic dynamics with the episodes' common noise realisation (docs/protocol.md#noise).
    `goal_mode` "derived" (docs/protocol.md#multi-goal) needs a run trained with derived goals, and "zeros" one
    trained with the all-zero goal (the run's train.json names its goal under env.goal)."""
    run_dir = Path(run_dir)
    manifest = _finished_manifest(run_dir)
    _check_same_split(run_dir, manifest, split)
    if (split is None) == (rules is None):
        raise ValueError("evaluate needs exactly one of a split or an explicit rule list")
    run_L = manifest["env"]["L"]
    if L is not None and int(L) != run_L:
        raise ValueError(f"env.L = {L} in the evaluation params but the run was trained at L = {run_L}")
    run_goal = manifest["env"].get("goal", GOAL)
    if run_goal != goal_mode:
        raise ValueError(f"env.goal: {goal_mode} in the evaluation params, but the run {run_dir} was trained with "
                         f"env.goal: {run_goal} (its train.json); a policy plays the goal protocol it was trained "
                         f"for: train it again with --params '{{\"env\": {{\"goal\": \"{goal_mode}\"}}}}' "
                         f"(docs/protocol.md#multi-goal)")
    selected = select_checkpoints(manifest, checkpoints)
    method = get_method(manifest["agent"])
    device = resolve_device(device)
    sides = side_protocols(L=run_L, H=H, episodes_per_rule=episodes_per_rule, eval_seed=eval_seed,
                           success_bonus=success_bonus, noise=noise, split=split, rules=rules,
                           goal_mode=goal_mode, goal_steps=goal_steps,
                           family=None if rules is None else family_from_config(manifest.get("family")))
    frames, agent, timings, cpu_start = [], None, [], time.process_time()
    with torch_settings(device, threads):
        for entry in selected:
            start = time.perf_counter()
            payload = ckpt.load(run_dir / entry["file"])
            if agent is None:
                agent = ckpt.build_policy_agent(payload, device)
            agent.load_policy_state_dict(payload["policy"])
            for episodes, protocol, types in sides:
                frame = play(greedy_policy(agent), method, episodes, protocol, types, device)
                frames.append(with_run_columns(frame, manifest["agent"], manifest["seed"], payload["env_steps"]))
            timings.append(time.perf_counter() - start)
            if log is not None:
                ok = frames[-len(sides):]
                shown = ", ".join(f"{f['side'].iloc[0]} {f['success'].mean():.3f}" for f in ok)
                log(f"checkpoint {payload['env_steps']}: strict success {shown} ({timings[-1]:.1f} s)")
    records = coerce_episode_frame(pd.concat(frames, ignore_index=True), with_agent=True)
    summary = {"checkpoints": [int(c["env_steps"]) for c in selected], "H": int(H),
               "episodes_per_rule": int(episodes_per_rule), "eval_seed": int(eval_seed),
               "seconds": round(sum(timings), 3), "cpu_seconds": round(time.process_time() - cpu_start, 3),
               "protocols": [p.as_dict() for _, p, _ in sides],
               "run": {"agent": manifest["agent"], "seed": manifest["seed"],
                       "fingerprint": manifest["fingerprint"],
                       "code_version": manifest["provenance"]["code_version"]}}
    return records, summary


def model_error_run(run_dir, H: int, *, split, episodes_per_rule: int = EPISODES_PER_RULE,
                    eval_seed: int = EVAL_SEED, context: int = MODEL_ERROR_CONTEXT, depth: int = MODEL_ERROR_DEPTH,
                    device="cpu", threads: int | None = 1) -> tuple[pd.DataFrame, dict]:
    """Open-loop prediction error of the final checkpoint's world model on the split's ID and OOD rules
    (`evaluation.model_error`); returns (per side x rule x depth table, summary for the Parquet metadata)."""
    run_dir = Path(run_dir)
    manifest = _finished_manifest(run_dir)
    _check_same_split(run_dir, manifest, split)
    method = get_method(manifest["agent"])
    if not method.world_model:
        raise ValueError(f"method {method.id!r} has no world model (its registry entry has world_model=False), "
                         f"so there is no prediction error to measure")
    check_probe(context, depth)
    device = resolve_device(device)
    start = time.perf_counter()
    frames = []
    with torch_settings(device, threads):
        entry = manifest["checkpoints"][-1]
        payload = ckpt.load(run_dir / entry["file"])
        agent = ckpt.build_policy_agent(payload, device)
        agent.load_policy_state_dict(payload["policy"])
        for side in SPLIT_SIDES:
            episodes, protocol, types = protocol_episodes(L=manifest["env"]["L"], H=H, split=split, side=side,
                                                          episodes_per_rule=episodes_per_rule, eval_seed=eval_seed)
            errors, valid = rollout_errors(agent, episodes, H, context=context, depth=depth, device=device)
            frames.append(error_table(errors, valid, episodes, side, types))
    table = pd.concat(frames, ignore_index=True)
    table.insert(0, "checkpoint", int(payload["env_steps"]))
    table.insert(0, "seed", int(manifest["seed"]))
    table.insert(0, "agent", manifest["agent"])
    summary = {"checkpoint": int(payload["env_steps"]), "H": int(H), "context": int(context), "depth": int(depth),
               "episodes_per_rule": int(episodes_per_rule), "eval_seed": int(eval_seed),
               "seconds": round(time.perf_counter() - start, 3),
               "run": {"agent": manifest["agent"], "seed": manifest["seed"], "fingerprint": manifest["fingerprint"],
                       "code_version": manifest["provenance"]["code_version"]}}
    return table, summary


def _finished_manifest(run_dir: Path) -> dict:
    if Path(run_dir).is_file():
        raise WrongKind(f"{run_dir} is not a training run's folder: it is {what_file_is(run_dir)}; give the folder "
                        f"written by `tapebench train --out`")
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise FileNotFoundError(f"no finished training run in {run_dir}: {ckpt.MANIFEST_FILE} is missing "
                                f"(run `tapebench train` first)")
    return manifest


def check_run_params(run_dir: Path, manifest: dict, env: dict, config) -> None:
    """A command that plays a trained run's policy (the world test, the few-shot study) refuses an L, H or
    hyperparameter in --params other than the run's: it would be recorded in the provenance yet not be what played."""
    for key in ("L", "H"):
        trained = manifest.get("env", {}).get(key)
        if trained is not None and int(env[key]) != int(trained):
            raise ValueError(f"--params env.{key} = {env[key]}, but run {run_dir} was trained at {key} = {trained}; "
                             f"give the run's env.{key}")
    trained = manifest.get("hyperparameters") or {}
    resolved = json.loads(json.dumps(dataclasses.asdict(config)))   # as the manifest stores them (lists, not tuples)
    differ = sorted(k for k, v in resolved.items() if k in trained and trained[k] != v)
    if differ:
        shown = ", ".join(f"{k} = {getattr(config, k)!r} (run: {trained[k]!r})" for k in differ)
        raise ValueError(f"--params agent differs from the hyperparameters run {run_dir} was trained with: {shown}; "
                         f"give the run's hyperparameters (agents.{manifest.get('agent')} of its config)")


def trained_run_manifest(run_dir: Path, method_id: str, seed: int, split) -> dict:
    """The finished run's manifest, refused unless it is `method_id`'s seed `seed` trained on `split`."""
    manifest = _finished_manifest(run_dir)
    if manifest["agent"] != method_id or int(manifest["seed"]) != seed:
        raise ValueError(f"run {run_dir} is {manifest['agent']!r} seed {manifest['seed']}, not {method_id!r} seed "
                         f"{seed}")
    _check_same_split(run_dir, manifest, split)
    return manifest


def _check_same_split(run_dir: Path, manifest: dict, split) -> None:
    if split is not None and manifest.get("split") and manifest["split"].get("content_hash") != split.content_hash:
        raise ValueError(f"run {run_dir} was trained on split {manifest['split'].get('name')!r} "
                         f"(hash {manifest['split'].get('content_hash', '')[:12]}), not on split {split.name!r} "
                         f"(hash {split.content_hash[:12]})")
