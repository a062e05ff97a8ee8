"""Oracle subcommands: mpc, exact, feasibility, oracle-gap, export-mpc-by-type."""
from __future__ import annotations

import time

from tapebench import defaults
from tapebench.layout import SPLITS_DIR
from tapebench.validation import seed_argument


def _episode_args(p, *, L: int, H: int, episodes_per_rule: int) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--rules", help="explicit rule list, e.g. '0-255' or '0,4,108,204,30,110' (side 'rules')")
    where.add_argument("--split", help="split name (in --splits-dir) or path to a split JSON")
    p.add_argument("--side", help="side of the split: train (ID) or test (OOD); required with --split")
    p.add_argument("--features", help="features Parquet giving rule types for --rules (else types are empty)")
    p.add_argument("--splits-dir", default=SPLITS_DIR, help="where split names are looked up")
    p.add_argument("--episodes-per-rule", type=int, default=episodes_per_rule,
                   help=f"evaluation episodes per rule (default {episodes_per_rule})")
    p.add_argument("--L", type=int, default=L, help=f"tape length (default {L})")
    p.add_argument("--H", type=int, default=H, help=f"episode horizon (default {H})")
    p.add_argument("--eval-seed", type=int, default=defaults.EVAL_SEED,
                   help=f"evaluation seed of the common-random-number episodes (default {defaults.EVAL_SEED}, "
                        f"as `tapebench evaluate`)")
    p.add_argument("--out", required=True, help="per-episode records Parquet")


def _planner_args(p) -> None:
    p.add_argument("--horizon", type=int, default=8, help="planning horizon: candidate sequence length (default 8)")
    p.add_argument("--candidates", type=int, default=512, help="candidate sequences per decision (default 512)")
    p.add_argument("--seed", type=seed_argument, default=0, help="planner seed (default 0)")


# the options that stand for a config key (pipeline.params checks them with its bounds)
EPISODE_OPTIONS = {"L": "env.L", "H": "evaluation.horizons[]", "episodes_per_rule": "evaluation.episodes_per_rule",
                   "eval_seed": "evaluation.eval_seed"}
PLANNER_OPTIONS = {"horizon": "oracle.horizon", "candidates": "oracle.candidates"}


def _check_options(args, options: dict) -> None:
    # lazy: a command loads only the modules it runs
    from tapebench.pipeline.params import check_options

    check_options(args, options)


def _protocol_kwargs(args) -> dict:
    # lazy: a command loads only the modules it runs
    from tapebench.validation import parse_rule_list

    _check_options(args, {**EPISODE_OPTIONS, **PLANNER_OPTIONS})
    if args.split is not None and args.side is None:
        raise ValueError("--split needs --side train or --side test")
    return {"L": args.L, "H": args.H, "episodes_per_rule": args.episodes_per_rule, "eval_seed": args.eval_seed,
            "split": args.split, "side": args.side,
            "rules": parse_rule_list(args.rules) if args.rules is not None else None,
            "features": args.features, "splits_dir": args.splits_dir}


def register(sub) -> None:
    p = sub.add_parser("mpc", description="Play the common-random-number evaluation episodes of a split side or a rule "
                                   "list with random-shooting MPC (true rule) and write per-episode records.")
    _episode_args(p, L=defaults.L, H=defaults.H, episodes_per_rule=defaults.EPISODES_PER_RULE)
    _planner_args(p)
    p.set_defaults(func=_mpc)

    p = sub.add_parser("exact", description="Play the evaluation episodes with the exact finite-horizon optimum: strict "
                                   "success whenever reachable (fewest steps), else least final distance.")
    _episode_args(p, L=defaults.FEASIBILITY_L, H=defaults.FEASIBILITY_H,
                  episodes_per_rule=defaults.EPISODES_PER_RULE)
    p.set_defaults(func=_exact)

    p = sub.add_parser("feasibility", description="Per rule: fraction of non-goal tapes from which strict success is reachable "
                                   "within H steps, and the distribution of the minimal number of steps.")
    p.add_argument("--rules", default="0-255", help="rule list (default 0-255)")
    p.add_argument("--L", type=int, default=defaults.FEASIBILITY_L,
                   help=f"tape length, at most 20 (default {defaults.FEASIBILITY_L})")
    p.add_argument("--H", type=int, default=defaults.FEASIBILITY_H, help=f"horizon (default {defaults.FEASIBILITY_H})")
    p.add_argument("--out", required=True, help="feasibility Parquet")
    p.set_defaults(func=_feasibility)

    p = sub.add_parser("oracle-gap", description="Compare the planning reference with the exact optimum episode by episode "
                                   "(both files must come from the same protocol) and write the success and "
                                   "distance gap per rule, per rule type and overall.")
    p.add_argument("--mpc", required=True, help="MPC records Parquet (tapebench mpc)")
    p.add_argument("--exact", required=True, help="exact records Parquet (tapebench exact), same protocol")
    p.add_argument("--out", required=True, help="comparison Parquet")
    p.set_defaults(func=_gap)

    p = sub.add_parser("export-mpc-by-type", description="Run MPC on one side of a split and write mpc_by_type_eval.json (Table 7).")
    p.add_argument("--split", required=True, help="split name (in --splits-dir) or path to a split JSON")
    p.add_argument("--side", default="test", help="train or test (default test)")
    p.add_argument("--splits-dir", default=SPLITS_DIR, help="where split names are looked up")
    p.add_argument("--episodes-per-rule", type=int, default=defaults.BY_TYPE_EPISODES_PER_RULE,
                   help=f"episodes per rule (default {defaults.BY_TYPE_EPISODES_PER_RULE})")
    p.add_argument("--L", type=int, default=defaults.L, help=f"tape length (default {defaults.L})")
    p.add_argument("--H", type=int, default=defaults.H, help=f"horizon (default {defaults.H})")
    p.add_argument("--eval-seed", type=int, default=defaults.EVAL_SEED,
                   help=f"evaluation seed (default {defaults.EVAL_SEED}, as `tapebench evaluate`)")
    _planner_args(p)
    p.add_argument("--out", default="mpc_by_type_eval.json", help="output JSON (default mpc_by_type_eval.json)")
    p.set_defaults(func=_by_type)


def _summary_line(frame) -> str:
    return (f"{len(frame)} episodes: success {frame['success'].mean():.3f}, final dist "
            f"{frame['final_dist'].mean():.3f}, AUC {frame['auc_dist'].mean():.3f}, "
            f"return {frame['return'].mean():.2f}")


def _mpc(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.methods.mpc import MPCConfig
    from tapebench.oracle.run import evaluate_oracle

    config = MPCConfig(horizon=args.horizon, candidates=args.candidates, seed=args.seed)
    start = time.perf_counter()
    frame = evaluate_oracle("mpc", args.out, mpc=config, **_protocol_kwargs(args))
    print(f"mpc: {_summary_line(frame)} ({time.perf_counter() - start:.1f} s) -> {args.out}")
    return 0


def _exact(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.oracle.run import evaluate_oracle

    start = time.perf_counter()
    frame = evaluate_oracle("exact", args.out, **_protocol_kwargs(args))
    print(f"exact: {_summary_line(frame)} ({time.perf_counter() - start:.1f} s) -> {args.out}")
    return 0


def _feasibility(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.oracle.feasibility import feasibility_summary, feasibility_table
    from tapebench.utils.io import provenance, write_parquet
    from tapebench.validation import parse_rule_list

    _check_options(args, {"L": "oracle.feasibility.L", "H": "oracle.feasibility.H"})
    rules = parse_rule_list(args.rules)
    start = time.perf_counter()
    frame = feasibility_table(rules, args.L, args.H)
    summary = feasibility_summary(frame)
    write_parquet(args.out, frame, meta=provenance({"L": args.L, "H": args.H, "rules": rules, "goal": ""}, None,
                                                   summary=summary))
    print(f"feasibility L={args.L} H={args.H}: {summary['rules_with_solvable_tape']}/{summary['rules']} rules have "
          f"a solvable tape (rule-wise {summary['rulewise_solvable']:.3f}); {summary['rules_fully_solvable']} are "
          f"solvable from every tape; mean tape-wise solvable fraction {summary['mean_solvable_fraction']:.3f} "
          f"({time.perf_counter() - start:.1f} s) -> {args.out}")
    return 0


def _gap(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.oracle.gap import format_gap, oracle_gap
    from tapebench.utils.io import provenance, write_parquet

    frame, protocol = oracle_gap(args.mpc, args.exact)
    write_parquet(args.out, frame, meta=provenance({"mpc": str(args.mpc), "exact": str(args.exact)}, None,
                                                   protocol=protocol))
    print(format_gap(frame))
    return 0


def _by_type(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.methods.mpc import MPCConfig
    from tapebench.oracle.by_type import export_mpc_by_type

    _check_options(args, {**EPISODE_OPTIONS, **PLANNER_OPTIONS,
                          "episodes_per_rule": "oracle.by_type_episodes_per_rule"})
    payload = export_mpc_by_type(args.out, split=args.split, side=args.side,
                                 episodes_per_rule=args.episodes_per_rule, L=args.L, H=args.H,
                                 eval_seed=args.eval_seed, splits_dir=args.splits_dir,
                                 mpc=MPCConfig(horizon=args.horizon, candidates=args.candidates, seed=args.seed))
    for t, v in [*payload["by_type"].items(), ("all", payload["all"])]:
        succ = "--" if v["success"] is None else f"{v['success']:.3f}"
        ret = "--" if v["mean_return"] is None else f"{v['mean_return']:.2f}"
        print(f"{t or '(untyped)':>10}: success {succ}, mean return {ret}, n = {v['n_episodes']}")
    print(f"-> {args.out}")
    return 0




