"""`tapebench worldtest`: one method, seed and interaction budget of the world test (docs/protocol.md#world-test).

  tapebench worldtest --method identify_then_plan --seed 0 --budget 8 --split results/splits/main.json \\
      --params '<JSON>' --out results/worldtest/main/identify_then_plan/seed0_B8.parquet
  tapebench worldtest --method dreamer --run results/runs/main/dreamer/seed0 --seed 0 --budget 8 ...

--params is the job's config slice (JSON object):
  {"env": {"L": 32, "H": 32, "success_bonus": 1.0},
   "worldtest": {"tasks", "problems_per_rule", "prediction": {"lengths", "masked_cells"},
                 "planning": {"horizon", "goal_steps"}, "detection": {"length"},
                 "planner": {"horizon", "candidates"}, "problem_seed"},
   "agent": {<overrides of the method's Config>}}
Missing keys take the defaults of docs/protocol.md#world-test; unknown keys are an error.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tapebench import defaults
from tapebench.episodes.streams import split_key
from tapebench.evaluation.trained_runs import check_run_params, trained_run_manifest
from tapebench.evaluation.worldtest import WorldTestSettings, check_family, run_worldtest
from tapebench.pipeline import resources
from tapebench.pipeline.params import check_options, check_sections
from tapebench.registry import build_config, get_method, registry
from tapebench.splits.io import load_split
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import resolve_device, torch_settings
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import check_output_file, parse_param_sections, seed_argument
from tapebench.vocabulary import ID_SIDE, OOD_SIDE

PARAM_SECTIONS = {
    "env": ("L", "H", "success_bonus"),
    "worldtest": ("tasks", "problems_per_rule", "prediction", "planning", "detection", "planner", "problem_seed",
                  "interaction_start", "methods", "seeds", "budgets"),
    "agent": None,
}


def parse_params(text: str) -> dict:
    return parse_param_sections(text, PARAM_SECTIONS)


def _trained_agent(run_dir: Path, method_id: str, seed: int, split, device, env: dict, config):
    manifest = trained_run_manifest(run_dir, method_id, seed, split)
    check_run_params(run_dir, manifest, env, config)
    entry = manifest["checkpoints"][-1]
    payload = ckpt.load(run_dir / entry["file"], sha256=entry.get("sha256"))
    agent = ckpt.build_policy_agent(payload, device)
    agent.load_policy_state_dict(payload["policy"])
    return agent, {"checkpoint": int(payload["env_steps"]), "fingerprint": manifest.get("fingerprint"),
                   "code_version": manifest.get("provenance", {}).get("code_version")}


def _check_size(settings: WorldTestSettings, split, L: int) -> None:
    """What validate_config refuses of the study: more planner rollouts per step than MAX_PLANNER_ROLLOUTS, more
    masked cells than the tape has, a job over this machine's memory (each naming the --params key)."""
    rollouts = settings.planner_horizon * settings.planner_candidates
    if rollouts > resources.MAX_PLANNER_ROLLOUTS:
        raise ValueError(f"--params key 'worldtest.planner': horizon x candidates = {settings.planner_horizon} x "
                         f"{settings.planner_candidates} = {rollouts:,} simulated steps per planned step and problem; "
                         f"at most {resources.MAX_PLANNER_ROLLOUTS:,} (as the config's studies.worldtest.planner)")
    if settings.masked_cells > L:
        raise ValueError(f"--params key 'worldtest.prediction.masked_cells': {settings.masked_cells} is more than "
                         f"env.L = {L}")
    problems = (len(split.train) + len(split.test)) * settings.problems_per_rule     # as pipeline.config estimates
    memory = resources.worldtest_memory(problems, L, settings.prediction_lengths, settings.masked_cells,
                                        settings.planner_candidates, settings.planner_horizon)
    limit = resources.machine_mem_mb()
    if memory.mb > limit:
        key = memory.largest.keys[0]
        raise ValueError(f"--params key 'worldtest.{key}': a world-test job of {problems:,} problems needs "
                         f"{memory.describe()}; this machine has {limit:,} MB. Lower {key}")


def run(args) -> int:
    check_output_file(args.out, "--out")
    check_options(args, {"budget": "studies.worldtest.budgets[]"})
    params = parse_params(args.params)
    check_sections(params, {"env": "env", "worldtest": "studies.worldtest"})
    env = {**defaults.ENV, **params.get("env", {})}
    settings = WorldTestSettings.from_config(params.get("worldtest", {}))
    method = get_method(args.method)
    if method.worldtest is None:
        able = sorted(m for m, x in registry().items() if x.worldtest is not None)
        raise ValueError(f"method {args.method!r} does not take part in the world test; methods that do: {able}")
    split = load_split(args.split)
    _check_size(settings, split, int(env["L"]))
    check_family(method, settings, split.family)
    config = build_config(args.method, params.get("agent", {}))
    device = resolve_device(args.device)
    start = time.perf_counter()
    with torch_settings(device, args.threads):
        agent, run = None, None
        if method.trains:
            if args.run is None:
                raise ValueError(f"method {args.method!r} trains: give its run folder with --run")
            agent, run = _trained_agent(Path(args.run), args.method, args.seed, split, device, env, config)
        elif args.run is not None:
            raise ValueError(f"method {args.method!r} does not train; --run is only for methods that train")

        def log(message: str) -> None:
            if not args.quiet:
                print(f"{time.strftime('%H:%M:%S')} [worldtest {args.method} seed {args.seed} B={args.budget}] "
                      f"{message}", file=sys.stderr, flush=True)

        table = run_worldtest(method, config, settings, sides={ID_SIDE: split.train, OOD_SIDE: split.test},
                               L=int(env["L"]), H=int(env["H"]), seed=args.seed, budget=args.budget,
                               split_name=split.name, split_key=split_key(split.content_hash), agent=agent,
                               success_bonus=float(env["success_bonus"]), device=device, log=log,
                               family=split.family)
    config_slice = {"env": env, "worldtest": settings.as_dict(), "agent": params.get("agent", {}),
                    "budget": int(args.budget)}
    write_parquet(args.out, table, meta={**provenance(config_slice, int(args.seed),
                                                      split={"name": split.name, "content_hash": split.content_hash},
                                                      run=run, seconds=round(time.perf_counter() - start, 3)),
                                         "table": "worldtest"})
    log(f"wrote {len(table)} problems to {args.out} ({time.perf_counter() - start:.1f} s)")
    return 0


def register(sub) -> None:
    able = sorted(m for m, x in registry().items() if x.worldtest is not None)
    p = sub.add_parser("worldtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, help=f"a method that takes part: {', '.join(able)}")
    p.add_argument("--seed", type=seed_argument, required=True,
                   help="the world-test seed (problems and the method's streams)")
    p.add_argument("--budget", type=int, required=True, help="interaction-phase steps (a reset costs one)")
    p.add_argument("--split", required=True, help="split JSON: ID = its training rules, OOD = its test rules")
    p.add_argument("--run", help="for a method that trains: its run folder (the final checkpoint answers)")
    p.add_argument("--params", default="{}", help="the job's config slice as JSON (see above)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", required=True, help="Parquet file of per-problem records to write")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)
