"""`tapebench train` and `tapebench evaluate`: the two commands the pipeline runs per seed.

  tapebench train --agent dqn --split results/splits/main.json --seed 3 --params '<JSON>' \\
      --out results/runs/main/dqn/seed3 [--device auto|cpu|cuda] [--threads 1]
  tapebench train --agent dqn --split results/splits/main.json --seeds 0-3 --params '<JSON>' \\
      --out 'results/runs/main/dqn/seed{seed}' --block-record results/runs/main/dqn/block0-3.json
  tapebench evaluate --run results/runs/main/dqn/seed3 --split results/splits/main.json --H 32 \\
      --params '<JSON>' --out results/runs/main/dqn/seed3/eval_H32.parquet

--params is the job's config slice (JSON object):
  {"agent": {<overrides of the agent's Config>}, "env": {"L": 32, "H": 32, "success_bonus": 1.0},
   "training": {"total_steps": 200000, "eval_every": 10000},
   "evaluation": {"episodes_per_rule": 20, "eval_seed": 20260101, "checkpoints": "all" | K, "noise": 0.0},
   "logging": {"tensorboard": false}}
Missing keys take the paper-protocol defaults; unknown keys are an error. `logging` (train only) writes
TensorBoard scalars under <out>/tensorboard/; it is not part of the run's fingerprint and changes no result.
`--rules 4` (instead of --split) trains / evaluates on an explicit rule list (fixed-z diagnostics).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tapebench import defaults
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols, write_evaluation
from tapebench.evaluation.model_error import summarize
from tapebench.evaluation.trained_runs import evaluate_run, model_error_run
from tapebench.pipeline.params import check_options, check_sections, check_value
from tapebench.pipeline.resources import check_evaluation, check_training
from tapebench.registry import build_config, registry
from tapebench.settings import training_device
from tapebench.splits.io import load_split
from tapebench.training.blocks import SEED_FIELD, STACKING, train_block, write_block_record
from tapebench.training.loop import RunLog, TrainSpec, read_manifest, resolve_device, torch_settings, train
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import (check_goal_mode, check_noise, parse_param_sections, parse_rule_list, parse_seed_list,
                                  seed_argument)

PARAM_SECTIONS = {
    "agent": None,  # checked against the agent's Config
    "env": (*defaults.ENV, "goal", "goal_steps"),   # env.goal / goal_steps: docs/protocol.md#multi-goal
    "training": (*defaults.TRAINING, "stacking"),   # stacking: a seed block's (training.stacking)
    "evaluation": ("episodes_per_rule", "eval_seed", "checkpoints", "noise"),
    "model_error": ("context", "depth"),
    "logging": ("tensorboard",),
}


# each --params section -> the config section whose schema bounds it (pipeline.params)
CONFIG_SECTIONS = {"env": "env", "training": "training", "evaluation": "evaluation",
                   "model_error": "diagnostics.model_error", "logging": "logging"}


def parse_params(text: str) -> dict:
    """A job's --params, each value within the bounds the config gives its key (a hand-run command accepts what the
    pipeline accepts); training.stacking also takes "never" (as --stacking), training.total_steps any budget of the
    budget study (0: the untrained network)."""
    params = parse_param_sections(text, PARAM_SECTIONS)
    check_sections(params, CONFIG_SECTIONS, skip=("training.stacking", "training.total_steps"))
    if "total_steps" in (params.get("training") or {}):
        check_value(params["training"]["total_steps"], "studies.budget.budgets[]", "training.total_steps",
                    params_key=True)
    return params


def _rule_source(args):
    """(split or None, rule tuple for training / None, split provenance)."""
    if (args.split is None) == (args.rules is None):
        raise ValueError("give exactly one of --split PATH or --rules LIST")
    if args.split is not None:

        split = load_split(args.split)
        return split, {"name": split.name, "content_hash": split.content_hash}
    return None, None


def run_train(args) -> int:
    params = parse_params(args.params)
    args.stacking = _stacking(args, params)
    seeds = _block_seeds(args)
    split, split_info = _rule_source(args)
    rules = tuple(split.train) if split is not None else tuple(parse_rule_list(args.rules))
    env = {**defaults.ENV, **params.get("env", {})}
    goal_mode, goal_steps = check_goal_mode(env.get("goal", defaults.GOAL), env.get("goal_steps", defaults.GOAL_STEPS))
    training = {**defaults.TRAINING, **params.get("training", {})}
    specs = [TrainSpec(agent=args.agent, rules=rules, seed=seed, hyperparameters=params.get("agent", {}),
                       L=env["L"], H=env["H"], success_bonus=float(env["success_bonus"]),
                       total_steps=training["total_steps"], eval_every=training["eval_every"], split=split_info,
                       family=None if split is None or split.family.elementary else split.family.as_dict(),
                       goal=goal_mode, goal_steps=goal_steps)
             for seed in seeds]
    check_training(args.agent, params.get("agent", {}) or {}, int(env["L"]), int(env["H"]), len(seeds))
    tensorboard = params.get("logging", {}).get("tensorboard", False)
    if not isinstance(tensorboard, bool):
        raise ValueError(f"--params logging.tensorboard must be true or false, got {tensorboard!r}")
    # provenance records what determines the numbers: logging is left out, so checkpoints do not depend on it
    config_slice = {k: params[k] for k in ("agent", "env", "training") if k in params}
    if split is None:
        config_slice["rules"] = list(rules)
    common = dict(device=args.device, threads=args.threads, config_slice=config_slice, quiet=args.quiet,
                  keep_resume=args.keep_resume, tensorboard=tensorboard)
    if args.seeds is None:
        train(specs[0], args.out, **{**common, "device": training_device(args.device, stacked=False)})
        return 0
    out_dirs = [args.out.replace(SEED_FIELD, str(seed)) for seed in seeds]
    manifests = train_block(specs, out_dirs, stacking=args.stacking, **common)
    if args.block_record is not None:
        write_block_record(args.block_record, manifests, out_dirs, config_slice)
    return 0


def _stacking(args, params: dict) -> str:
    """How a seed block stacks: --stacking, or the pipeline's `training.stacking` in --params (not both)."""
    stacking = params.get("training", {}).get("stacking")
    if stacking is None:
        return args.stacking
    if args.stacking != "auto" and args.stacking != stacking:
        raise ValueError(f"--stacking {args.stacking} and --params training.stacking {stacking!r} disagree")
    return stacking


def _block_seeds(args) -> list[int]:
    """The seeds of this job: --seed, or --seeds (with {seed} in --out)."""
    if args.seeds is None:
        if args.block_record is not None or args.stacking != "auto":
            raise ValueError("--block-record and --stacking need --seeds")
        return [args.seed]
    seeds = parse_seed_list(args.seeds)
    if SEED_FIELD not in args.out:
        raise ValueError(f"--seeds needs {SEED_FIELD} in --out (each seed's run folder), got {args.out!r}")
    return seeds


def run_evaluate(args) -> int:
    check_options(args, {"H": "evaluation.horizons[]"})
    params = parse_params(args.params)
    if (args.run is None) == (args.method is None):
        raise ValueError("give --run DIR (a trained run) or --method ID --seed N (a method that does not train)")
    split, _ = _rule_source(args)
    rules = tuple(parse_rule_list(args.rules)) if split is None else None
    if args.seeds is None:
        return _evaluate_one(args, params, split, rules)
    seeds = parse_seed_list(args.seeds)
    patterns = {"--out": args.out, **({"--run": args.run} if args.run is not None else {})}
    for flag, pattern in patterns.items():
        if SEED_FIELD not in pattern:
            raise ValueError(f"--seeds needs {SEED_FIELD} in {flag} (each seed's own file), got {pattern!r}")
    for seed in seeds:      # one after another in this process: each seed's records as its own command writes them
        named = {flag.lstrip("-"): pattern.replace(SEED_FIELD, str(seed)) for flag, pattern in patterns.items()}
        _evaluate_one(argparse.Namespace(**{**vars(args), "seed": seed, "seeds": None, **named}), params, split, rules)
    return 0


def _check_evaluation_memory(args, params: dict, split, rules) -> None:
    """The job's memory estimate (all episodes of both sides at once), refused above this machine's memory naming
    the key to lower (as validate_config refuses such a config); a run whose train.json cannot be read is left to
    the evaluation, which names what is wrong with it."""
    env, evaluation = params.get("env", {}), params.get("evaluation", {})
    rule_count = len(split.train) + len(split.test) if split is not None else len(rules)
    episodes = rule_count * int(evaluation.get("episodes_per_rule", defaults.EPISODES_PER_RULE))
    if args.method is not None:
        method, hyperparameters, L = args.method, params.get("agent", {}) or {}, env.get("L", defaults.L)
    else:
        try:
            manifest = read_manifest(args.run, verify=False)
            method, hyperparameters, L = manifest["agent"], manifest["hyperparameters"], manifest["env"]["L"]
        except (ValueError, TypeError, KeyError):
            return
        try:
            build_config(method, hyperparameters)
        except (ValueError, TypeError, KeyError):     # the run's own checks name what is wrong with it
            return
    check_evaluation(method, hyperparameters, int(L), int(args.H), episodes)


def _evaluate_one(args, params: dict, split, rules) -> int:
    """One seed's evaluation: a trained run's checkpoints (--run) or a method's own seed (--method, --seed)."""
    _check_evaluation_memory(args, params, split, rules)
    env, evaluation = params.get("env", {}), params.get("evaluation", {})
    common = dict(episodes_per_rule=evaluation.get("episodes_per_rule", defaults.EPISODES_PER_RULE),
                  eval_seed=evaluation.get("eval_seed", defaults.EVAL_SEED),
                  success_bonus=float(env.get("success_bonus", defaults.SUCCESS_BONUS)),
                  noise=float(check_noise(evaluation.get("noise", 0.0))))
    goal_mode, goal_steps = check_goal_mode(env.get("goal", defaults.GOAL), env.get("goal_steps", defaults.GOAL_STEPS))
    if args.run is not None:
        label = f"H{args.H}" + (f"_noise{common['noise']:g}" if common["noise"] else "")
        log = RunLog(Path(args.run) / f"evaluate_{label}.log", f"evaluate {label}", args.quiet)
        records, summary = evaluate_run(args.run, args.H, split=split, rules=rules,
                                        checkpoints=evaluation.get("checkpoints", "all"), L=env.get("L"),
                                        device=args.device, threads=args.threads, log=log, goal_mode=goal_mode,
                                        goal_steps=goal_steps, **common)
    else:
        log = _untrained_log(args)
        records, summary = _evaluate_untrained(args, params, split, rules, env,
                                               {**common, "goal_mode": goal_mode, "goal_steps": goal_steps}, log)
    config_slice = {k: params[k] for k in ("agent", "env", "evaluation") if k in params}
    config_slice["H"] = args.H
    if rules is not None:
        config_slice["rules"] = list(rules)
    write_evaluation(args.out, records, summary, config_slice, int(records["seed"].iloc[0]), split)
    log(f"wrote {len(records)} episode records ({len(summary['checkpoints'])} checkpoints) to {args.out}")
    return 0


def run_model_error(args) -> int:
    check_options(args, {"H": "env.H"})
    params = parse_params(args.params)
    split = load_split(args.split)
    evaluation, probe = params.get("evaluation", {}), params.get("model_error", {})
    table, summary = model_error_run(args.run, args.H, split=split,
                                     episodes_per_rule=evaluation.get("episodes_per_rule", defaults.EPISODES_PER_RULE),
                                     eval_seed=evaluation.get("eval_seed", defaults.EVAL_SEED),
                                     context=probe.get("context", defaults.MODEL_ERROR_CONTEXT),
                                     depth=probe.get("depth", defaults.MODEL_ERROR_DEPTH), device=args.device,
                                     threads=args.threads)
    config_slice = {k: params[k] for k in ("env", "evaluation", "model_error") if k in params}
    config_slice["H"] = args.H
    split_info = {"name": split.name, "content_hash": split.content_hash}
    write_parquet(args.out, table, meta={**provenance(config_slice, int(table["seed"].iloc[0]), split=split_info,
                                                      model_error=summary), "table": "model_error"})
    if not args.quiet:
        shown = summarize(table)
        one_step = {r.side: r.error for r in shown[shown["depth"] == 1].itertuples()}
        print(f"[model-error {summary['run']['agent']} seed {summary['run']['seed']}] one-step error "
              f"ID {one_step.get('train', float('nan')):.3f} OOD {one_step.get('test', float('nan')):.3f}; "
              f"wrote {args.out} ({summary['seconds']:.1f} s)")
    return 0


def _untrained_log(args):
    def log(message: str) -> None:
        if not args.quiet:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [evaluate {args.method} seed {args.seed} H={args.H}] "
                  f"{message}", file=sys.stderr, flush=True)
    return log


def _evaluate_untrained(args, params, split, rules, env, common, log):
    device = resolve_device(args.device)
    sides = side_protocols(L=env.get("L", defaults.L), H=args.H, split=split, rules=rules, **common)
    train_rules = tuple(split.train) if split is not None else tuple(rules)
    with torch_settings(device, args.threads):
        return evaluate_untrained(args.method, params.get("agent", {}), args.seed, sides, train_rules=train_rules,
                                  device=device, log=log)


TRAIN_DESCRIPTION = """\
Train one agent for one seed on a split's training rules (or an explicit rule list) and write the
run into --out: evaluation checkpoints (checkpoints/), train.log and, at the end, train.json.
With --seeds, train a block of seeds in one process, each into its own folder (--out with {seed}):
stacked into one model where the method can (docs/protocol.md#seed-blocks), else one after another.
Progress lines (steps, steps/s, ETA) go to stderr and train.log.

Run the same command again after an interruption and it resumes from the last checkpoint; a
finished run with intact files is left alone, and one whose files are damaged is trained again.
"""
TRAIN_EPILOG = """\
example:
  tapebench train --agent dqn --split results/splits/main.json --seed 0 --out runs/dqn/seed0 \\
      --params '{"training": {"total_steps": 20000, "eval_every": 10000}, "agent": {"learning_rate": 0.001}}'
"""
EVALUATE_DESCRIPTION = """\
Evaluate a method on the evaluation episodes: every checkpoint of a finished training run (--run),
or a method that does not train (--method with --seed, its own random stream), on the split's
training rules (ID) and test rules (OOD), or an explicit rule list, at horizon --H.
Writes one record per episode (agent, seed, checkpoint, side, rule, success, distances, return).
Every method, seed and checkpoint plays the same episodes, so comparisons are paired.
With --seeds, a block of seeds is evaluated in one process (one start-up), each into its own file.
"""
EVALUATE_EPILOG = """\
example:
  tapebench evaluate --run runs/dqn/seed0 --split results/splits/main.json --H 32 \\
      --params '{"evaluation": {"episodes_per_rule": 5}}' --out runs/dqn/seed0/eval_H32.parquet
  tapebench evaluate --method mpc --seed 3 --split results/splits/main.json --H 32 --out mpc_seed3.parquet
  tapebench evaluate --run 'runs/dqn/seed{seed}' --seeds 0-3 --split results/splits/main.json --H 32 \\
      --out 'runs/dqn/seed{seed}/eval_H32.parquet'
"""


MODEL_ERROR_DESCRIPTION = """\
Measure the world model of a finished run (its last checkpoint) on probe trajectories: from every
evaluation episode's initial tape, uniformly random cells (the same for every model) drive the true
rule; the model sees the first --params model_error.context transitions and predicts the next `depth`
tapes open loop. Error = fraction of wrongly predicted cells, per side (ID / OOD), rule and depth;
depth 1 is the one-step error.
"""
MODEL_ERROR_EPILOG = """\
example:
  tapebench model-error --run results/runs/main/dreamer/seed0 --split results/splits/main.json \\
      --params '{"model_error": {"context": 4, "depth": 16}}' --out results/runs/main/dreamer/seed0/model_error.parquet
"""


def _common(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--split", help="split file written by `tapebench split` (results/splits/NAME.json)")
    where.add_argument("--rules", help="an explicit rule list instead of a split, e.g. '4' or '0,4,108'")
    p.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda[:N] (default auto)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    p.add_argument("--quiet", action="store_true", help="write log lines only to the run's log file, not stderr")


def register(sub) -> None:
    p = sub.add_parser("train", description=TRAIN_DESCRIPTION, epilog=TRAIN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", required=True, metavar="METHOD",
                   help=f"a method that trains: {', '.join(sorted(m for m, x in registry().items() if x.trains))}")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=seed_argument, default=0, help="training seed (default 0)")
    seeds.add_argument("--seeds", metavar="LIST",
                       help="a seed block trained in one process, e.g. '0-3' or '0,5,7' (docs/protocol.md#seed-blocks);"
                            f" --out then names each seed's folder with {SEED_FIELD}")
    p.add_argument("--out", required=True, help="run folder to write (created after the arguments are checked)")
    p.add_argument("--block-record", metavar="PATH",
                   help="with --seeds: write a JSON record of the block's finished runs here (the pipeline's target)")
    p.add_argument("--stacking", choices=STACKING, default="auto",
                   help="with --seeds: auto (default) stacks a method where its stacked seeds are its one-seed runs bit "
                        "for bit, and on a GPU; always wherever the method can; never: one after another")
    p.add_argument("--params", default="{}",
                   help='settings as JSON: {"env": {"L", "H", "success_bonus"}, "training": {"total_steps", '
                        '"eval_every"}, "agent": {hyperparameters}, "logging": {"tensorboard": true|false}}; what '
                        f'is left out takes the paper protocol\'s value (L = {defaults.L}, H = {defaults.H}, '
                        f'{defaults.TOTAL_STEPS} steps, a checkpoint every {defaults.EVAL_EVERY}, no TensorBoard)')
    p.add_argument("--keep-resume", action="store_true",
                   help="keep resume.pt (the full training state) after the run finishes (default: delete it)")
    _common(p)
    p.set_defaults(func=run_train)

    p = sub.add_parser("evaluate", description=EVALUATE_DESCRIPTION, epilog=EVALUATE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run folder written by `tapebench train`")
    p.add_argument("--method", help="instead of --run, a method that does not train: "
                                    f"{', '.join(sorted(m for m, x in registry().items() if x.make_policy))}")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=seed_argument, default=0, help="with --method: the method's seed (default 0)")
    seeds.add_argument("--seeds", metavar="LIST",
                       help="a block of seeds evaluated one after another in one process, e.g. '0-3': --out (and --run) "
                            f"then name each seed's file with {SEED_FIELD} (docs/protocol.md#seed-blocks)")
    p.add_argument("--H", type=int, required=True, help="evaluation horizon (steps per episode)")
    p.add_argument("--out", required=True, help="Parquet file of per-episode records to write")
    p.add_argument("--params", default="{}",
                   help='settings as JSON: {"env": {"L", "success_bonus", "goal", "goal_steps"}, '
                        '"evaluation": {"episodes_per_rule", '
                        '"eval_seed", "checkpoints": "all" or K (the last K), "noise": cell-update noise epsilon '
                        'in [0, 0.5]}, "agent": {hyperparameters of --method}}; what is left out takes the paper '
                        f'protocol\'s value ({defaults.EPISODES_PER_RULE} episodes per rule, every checkpoint, no '
                        'noise)')
    _common(p)
    p.set_defaults(func=run_evaluate)

    p = sub.add_parser("model-error", description=MODEL_ERROR_DESCRIPTION, epilog=MODEL_ERROR_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run folder of a method with a world model (`tapebench methods -v`)")
    p.add_argument("--split", required=True, help="split file the run was trained on")
    p.add_argument("--H", type=int, default=defaults.H,
                   help=f"the horizon behind the time feature t/H of the probe observations (default {defaults.H})")
    p.add_argument("--out", required=True, help="Parquet file to write (one row per side x rule x depth)")
    p.add_argument("--params", default="{}",
                   help='settings as JSON: {"evaluation": {"episodes_per_rule", "eval_seed"}, "model_error": '
                        f'{{"context", "depth"}}}}; defaults: {defaults.EPISODES_PER_RULE} episodes per rule, '
                        f'{defaults.MODEL_ERROR_CONTEXT} context steps, depth {defaults.MODEL_ERROR_DEPTH}')
    p.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda[:N] (default auto)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    p.add_argument("--quiet", action="store_true", help="print nothing")
    p.set_defaults(func=run_model_error)
