"""`tapebench fewshot` and `tapebench aggregate-fewshot`: the few-shot adaptation study (docs/protocol.md#few-shot).

  tapebench fewshot --method bayes_filter --seed 0 --split results/splits/main.json --params '<JSON>' \\
      --out results/fewshot/main/bayes_filter/seed0.parquet
  tapebench fewshot --method ppo --run results/runs/main/ppo/seed0 --seed 0 --split results/splits/main.json ...
  tapebench aggregate-fewshot --inputs results/fewshot/main/*/seed*.parquet --out results/fewshot.parquet

--params is the job's config slice (JSON object):
  {"env": {"L", "H", "success_bonus", "goal", "goal_steps"},
   "evaluation": {"episodes_per_rule", "eval_seed"},
   "fewshot": {"shots", "rules_per_side", "adapt": {<overrides of the gradient-adaptation recipe>}},
   "agent": {<overrides of the method's Config>}}
Missing keys take the defaults of docs/protocol.md#few-shot; unknown keys are an error. A method that trains adapts
its run's final checkpoint (--run); the test episodes are its evaluation's episodes at env.H.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tapebench import defaults
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import check_goal_mode, check_output_file, parse_param_sections, seed_argument

PARAM_SECTIONS = {
    "env": (*defaults.ENV, "goal", "goal_steps"),
    "evaluation": ("episodes_per_rule", "eval_seed"),
    "fewshot": ("shots", "rules_per_side", "adapt"),
    "agent": None,
}


def parse_params(text: str) -> dict:
    return parse_param_sections(text, PARAM_SECTIONS)


def _final_checkpoint(run_dir: Path, method_id: str, seed: int, split, env: dict, config) -> dict:
    # lazy: a command loads only the modules it runs
    from tapebench.evaluation.trained_runs import check_run_params, trained_run_manifest
    from tapebench.training import checkpoint as ckpt

    manifest = trained_run_manifest(run_dir, method_id, seed, split)
    run_goal = manifest["env"].get("goal", defaults.GOAL)
    if run_goal != env.get("goal", defaults.GOAL):
        raise ValueError(f"env.goal: {env.get('goal', defaults.GOAL)} in --params, but run {run_dir} was trained with "
                         f"env.goal: {run_goal}")
    check_run_params(run_dir, manifest, env, config)
    entry = manifest["checkpoints"][-1]
    payload = ckpt.load(run_dir / entry["file"], sha256=entry.get("sha256"))
    payload["fingerprint"] = manifest.get("fingerprint")
    return payload


def run(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.evaluation.fewshot import FewShotSettings, run_fewshot
    from tapebench.registry import build_config, get_method
    from tapebench.splits.io import load_split
    from tapebench.training.loop import resolve_device, torch_settings

    # lazy: a command loads only the modules it runs
    from tapebench.pipeline.params import check_sections

    check_output_file(args.out, "--out")
    params = parse_params(args.params)
    check_sections(params, {"env": "env", "evaluation": "evaluation", "fewshot": "studies.fewshot"})
    env = {**defaults.ENV, **params.get("env", {})}
    goal_mode, goal_steps = check_goal_mode(env.get("goal", defaults.GOAL), env.get("goal_steps", defaults.GOAL_STEPS))
    evaluation = {"episodes_per_rule": defaults.EPISODES_PER_RULE, "eval_seed": defaults.EVAL_SEED,
                  **params.get("evaluation", {})}
    settings = FewShotSettings.from_config(params.get("fewshot", {}))
    method = get_method(args.method)
    if not method.plays_episodes:
        raise ValueError(f"method {args.method!r} takes part in the world test only; it plays no TAPE episodes")
    split = load_split(args.split)
    config = build_config(args.method, params.get("agent", {}))
    device = resolve_device(args.device)
    start = time.perf_counter()

    def log(message: str) -> None:
        if not args.quiet:
            print(f"{time.strftime('%H:%M:%S')} [fewshot {args.method} seed {args.seed}] {message}", file=sys.stderr,
                  flush=True)

    with torch_settings(device, args.threads):
        payload, run_info = None, None
        if method.trains:
            if args.run is None:
                raise ValueError(f"method {args.method!r} trains: give its run folder with --run")
            payload = _final_checkpoint(Path(args.run), args.method, args.seed, split, env, config)
            run_info = {"checkpoint": int(payload["env_steps"]), "fingerprint": payload["fingerprint"],
                        "code_version": payload.get("provenance", {}).get("code_version")}
        elif args.run is not None:
            raise ValueError(f"method {args.method!r} does not train; --run is only for methods that train")
        records = run_fewshot(method, settings, split=split, seed=args.seed, L=int(env["L"]), H=int(env["H"]),
                              episodes_per_rule=int(evaluation["episodes_per_rule"]),
                              eval_seed=int(evaluation["eval_seed"]), success_bonus=float(env["success_bonus"]),
                              goal_mode=goal_mode, goal_steps=goal_steps, payload=payload,
                              hyperparameters=None if method.trains else params.get("agent", {}), device=device,
                              log=log)
    config_slice = {"env": env, "evaluation": evaluation, "fewshot": settings.as_dict(),
                    "agent": params.get("agent", {})}
    write_parquet(args.out, records, meta={**provenance(config_slice, int(args.seed),
                                                        split={"name": split.name, "content_hash": split.content_hash},
                                                        run=run_info, seconds=round(time.perf_counter() - start, 3)),
                                           "table": "fewshot"})
    log(f"wrote {len(records)} test episodes to {args.out} ({time.perf_counter() - start:.1f} s)")
    return 0


def aggregate(args) -> int:
    # lazy: a command loads only the modules it runs
    import pandas as pd

    # lazy: a command loads only the modules it runs
    from tapebench.stats.fewshot import aggregate_fewshot
    from tapebench.pipeline.params import STATISTICS_OPTIONS, check_options
    from tapebench.utils.artifacts import read_tables

    check_options(args, STATISTICS_OPTIONS)
    frames = [frame for frame, _ in read_tables(args.inputs, "fewshot", "few-shot")]
    table = aggregate_fewshot(pd.concat(frames, ignore_index=True), n_resamples=args.n_resamples, ci=args.ci,
                              seed=args.seed)
    config = {"n_resamples": args.n_resamples, "ci": args.ci, "seed": args.seed}
    write_parquet(args.out, table, meta={**provenance(config, args.seed, inputs=[str(p) for p in args.inputs]),
                                         "table": "fewshot_aggregate"})
    print(f"aggregate-fewshot: {table['agent'].nunique()} methods, {len(table)} rows -> {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("fewshot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, help="a registered method (`tapebench methods`)")
    p.add_argument("--seed", type=seed_argument, required=True,
                   help="the method's seed: its run's seed, or the stream of a method that does not train")
    p.add_argument("--split", required=True, help="split JSON: ID = its training rules, OOD = its test rules")
    p.add_argument("--run", help="for a method that trains: its run folder (the final checkpoint adapts)")
    p.add_argument("--params", default="{}", help="the job's config slice as JSON (see above)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", required=True, help="Parquet file of few-shot records to write")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)

    p = sub.add_parser("aggregate-fewshot", description="Pool the tables of `tapebench fewshot` (one per method and "
                                                        "seed): success vs k per method and side, means over seeds "
                                                        "with percentile-bootstrap CIs.")
    p.add_argument("--inputs", nargs="+", required=True, metavar="PARQUET", help="tables of `tapebench fewshot`")
    p.add_argument("--n-resamples", type=int, default=defaults.N_RESAMPLES,
                   help=f"bootstrap resamples (default {defaults.N_RESAMPLES})")
    p.add_argument("--ci", type=float, default=defaults.CI, help=f"confidence level (default {defaults.CI})")
    p.add_argument("--seed", type=int, default=defaults.STATISTICS_SEED,
                   help=f"bootstrap seed (default {defaults.STATISTICS_SEED})")
    p.add_argument("--out", required=True, help="aggregate Parquet to write")
    p.set_defaults(func=aggregate)
