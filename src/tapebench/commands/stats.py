"""`tapebench aggregate-seed`, `tapebench aggregate`, `tapebench aggregate-model-error`,
`tapebench aggregate-worldtest` and `tapebench protocol-comparison`."""
from __future__ import annotations

import json
from pathlib import Path

from tapebench import defaults
from tapebench.pipeline.params import STATISTICS_OPTIONS, check_options
from tapebench.utils.io import provenance, read_parquet_meta, write_parquet
from tapebench.validation import seed_argument


def register(sub) -> None:
    p = sub.add_parser("aggregate-seed", description="Reduce per-episode evaluation records to one value per seed and metric (the "
                                   "mean over episodes at each checkpoint, averaged over the last K checkpoints), "
                                   "and optionally learning curves and per-rule values. Table formats: "
                                   "docs/protocol.md#outputs.")
    p.add_argument("--episodes", nargs="+", required=True, metavar="PARQUET",
                   help="per-episode records written by `tapebench evaluate`")
    p.add_argument("--last-k", type=int, default=defaults.LAST_K,
                   help=f"checkpoints averaged into a seed's value (default {defaults.LAST_K})")
    p.add_argument("--out", required=True, help="per-seed Parquet")
    p.add_argument("--curves-out", help="optional: per-checkpoint values (learning curves) Parquet")
    p.add_argument("--per-rule-out", help="optional: per-rule values Parquet")
    p.set_defaults(func=_aggregate_seed)

    p = sub.add_parser("aggregate", description="Bootstrap over seeds: the mean and a percentile confidence interval per "
                                   "(split, agent, L, H, side, metric), the ID-OOD drop with a paired bootstrap, and "
                                   "Welch tests between agents with Holm correction "
                                   "(docs/protocol.md#statistics).")
    p.add_argument("--per-seed", nargs="+", required=True, metavar="PARQUET",
                   help="per-seed tables written by `tapebench aggregate-seed`")
    p.add_argument("--n-resamples", type=int, default=defaults.N_RESAMPLES,
                   help=f"bootstrap resamples (default {defaults.N_RESAMPLES})")
    p.add_argument("--ci", type=float, default=defaults.CI, help=f"confidence level (default {defaults.CI})")
    p.add_argument("--seed", type=seed_argument, default=defaults.STATISTICS_SEED,
                   help=f"seed of the bootstrap generators (default {defaults.STATISTICS_SEED})")
    p.add_argument("--out", required=True, help="aggregate Parquet")
    p.add_argument("--tests-out", help="optional: pairwise Welch tests (Holm-corrected) on OOD, Parquet")
    p.add_argument("--reference", default=defaults.REFERENCE,
                   help=f"method whose OOD success normalises ON(p) = 100 p / p_ref (default {defaults.REFERENCE}; "
                        "skipped if absent)")
    p.set_defaults(func=_aggregate)

    p = sub.add_parser("aggregate-model-error", description="Pool the tables of `tapebench model-error` (one per run): per method, side, "
                                   "rule type ('all' pools them) and open-loop depth, the mean error over seeds "
                                   "with a percentile bootstrap CI (docs/protocol.md#model-error).")
    p.add_argument("--inputs", nargs="+", required=True, metavar="PARQUET", help="tables of `tapebench model-error`")
    p.add_argument("--n-resamples", type=int, default=defaults.N_RESAMPLES,
                   help=f"bootstrap resamples (default {defaults.N_RESAMPLES})")
    p.add_argument("--ci", type=float, default=defaults.CI, help=f"confidence level (default {defaults.CI})")
    p.add_argument("--seed", type=seed_argument, default=defaults.STATISTICS_SEED,
                   help=f"seed of the bootstrap generators (default {defaults.STATISTICS_SEED})")
    p.add_argument("--out", required=True, help="aggregate Parquet")
    p.set_defaults(func=_aggregate_model_error)

    p = sub.add_parser("aggregate-worldtest", description="Pool the tables of `tapebench worldtest` (one per method, "
                                   "seed and budget): per method, task, side and budget, the mean score over seeds "
                                   "with a percentile bootstrap CI (docs/protocol.md#world-test).")
    p.add_argument("--inputs", nargs="+", required=True, metavar="PARQUET", help="tables of `tapebench worldtest`")
    p.add_argument("--n-resamples", type=int, default=defaults.N_RESAMPLES,
                   help=f"bootstrap resamples (default {defaults.N_RESAMPLES})")
    p.add_argument("--ci", type=float, default=defaults.CI, help=f"confidence level (default {defaults.CI})")
    p.add_argument("--seed", type=seed_argument, default=defaults.STATISTICS_SEED,
                   help=f"seed of the bootstrap generators (default {defaults.STATISTICS_SEED})")
    p.add_argument("--out", required=True, help="aggregate Parquet")
    p.set_defaults(func=_aggregate_worldtest)

    p = sub.add_parser("protocol-comparison", description="Rank the methods under each protocol (a selection of per-seed rows: split, H, "
                                   "side), then compare every pair of protocols: Kendall's tau-b, rank reversals, "
                                   "best-method changes, with a seed bootstrap (docs/protocol.md#protocol-comparison)."
                                   " The first protocol is the reference.")
    p.add_argument("--protocols", required=True,
                   help="JSON list of protocols, each {name, split, H, side, per_seed: [PARQUET, ...], family, "
                        "runs, match}")
    p.add_argument("--metric", default="success", help="per-seed metric to rank by (default success)")
    p.add_argument("--n-resamples", type=int, default=defaults.N_RESAMPLES,
                   help=f"bootstrap resamples (default {defaults.N_RESAMPLES})")
    p.add_argument("--ci", type=float, default=defaults.CI, help=f"confidence level (default {defaults.CI})")
    p.add_argument("--seed", type=seed_argument, default=defaults.STATISTICS_SEED,
                   help=f"seed of the bootstrap generators (default {defaults.STATISTICS_SEED})")
    p.add_argument("--out", required=True, help="pairwise comparison Parquet")
    p.add_argument("--ranks-out", required=True, help="per protocol and method: mean, rank, rank CI Parquet")
    p.add_argument("--reversals-out", required=True, help="per pair of protocols and methods: reversals Parquet")
    p.set_defaults(func=_protocol_comparison)


def _aggregate_seed(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.stats.aggregate import read_tables, seed_tables

    check_options(args, {"last_k": "evaluation.last_k"})
    episodes = read_tables(args.episodes, "episode")
    tables = seed_tables(episodes, last_k=args.last_k)
    meta = provenance({"last_k": args.last_k}, None, last_k=args.last_k, inputs=_inputs(args.episodes))
    write_parquet(args.out, tables["per_seed"], meta={**meta, "table": "per_seed"})
    if args.curves_out:
        write_parquet(args.curves_out, tables["curves"], meta={**meta, "table": "curves"})
    if args.per_rule_out:
        write_parquet(args.per_rule_out, tables["per_rule"], meta={**meta, "table": "per_rule"})
    per_seed = tables["per_seed"]
    print(f"aggregate-seed: {per_seed[['agent', 'H', 'seed', 'side']].drop_duplicates().shape[0]} "
          f"(agent, H, seed, side) groups from {len(episodes)} episodes -> {args.out}")
    return 0


def _aggregate(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.stats.aggregate import aggregate_seeds, method_tests, read_tables

    check_options(args, STATISTICS_OPTIONS)
    per_seed = read_tables(args.per_seed, "per-seed")
    summary = aggregate_seeds(per_seed, n_resamples=args.n_resamples, ci=args.ci, seed=args.seed,
                              reference=args.reference)
    config = {"n_resamples": args.n_resamples, "ci": args.ci, "seed": args.seed, "reference": args.reference}
    inputs = _inputs(args.per_seed)
    last_k = sorted({m.get("last_k") for m in map(read_parquet_meta, args.per_seed) if m.get("last_k")})
    meta = provenance(config, args.seed, inputs=inputs, last_k=last_k[0] if len(last_k) == 1 else last_k)
    write_parquet(args.out, summary, meta={**meta, "table": "aggregate"})
    if args.tests_out:
        tests = method_tests(per_seed, n_resamples=args.n_resamples, ci=args.ci, seed=args.seed)
        write_parquet(args.tests_out, tests, meta={**meta, "table": "tests"})
    groups = summary[["split", "agent", "L", "H"]].drop_duplicates().shape[0]
    print(f"aggregate: {groups} (split, agent, L, H) groups, {len(summary)} rows -> {args.out}")
    return 0


def _aggregate_model_error(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.stats.model_error import aggregate_model_error_files

    check_options(args, STATISTICS_OPTIONS)
    table = aggregate_model_error_files(args.inputs, args.out, n_resamples=args.n_resamples, ci=args.ci,
                                        seed=args.seed)
    print(f"aggregate-model-error: {table['agent'].nunique()} methods, {len(table)} rows -> {args.out}")
    return 0


def _aggregate_worldtest(args) -> int:
    # lazy: a command loads only the modules it runs
    import pandas as pd

    # lazy: a command loads only the modules it runs
    from tapebench.stats.worldtest import aggregate_worldtest
    from tapebench.utils.artifacts import read_tables

    check_options(args, STATISTICS_OPTIONS)
    frames = [frame for frame, _ in read_tables(args.inputs, "worldtest", "world-test")]
    table = aggregate_worldtest(pd.concat(frames, ignore_index=True), n_resamples=args.n_resamples, ci=args.ci,
                                seed=args.seed)
    config = {"n_resamples": args.n_resamples, "ci": args.ci, "seed": args.seed}
    write_parquet(args.out, table, meta={**provenance(config, args.seed, inputs=[str(p) for p in args.inputs]),
                                         "table": "worldtest_aggregate"})
    print(f"aggregate-worldtest: {table['agent'].nunique()} methods, {len(table)} rows -> {args.out}")
    return 0


def _protocol_comparison(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.stats.protocol_comparison import compare_protocol_files
    from tapebench.stats.protocols import ComparedProtocol, protocol_files

    check_options(args, STATISTICS_OPTIONS)
    try:
        spec = json.loads(args.protocols)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--protocols is not valid JSON ({exc}); give a list of protocol objects") from None
    if not isinstance(spec, list) or not all(isinstance(p, dict) for p in spec):
        raise ValueError("--protocols must be a JSON list of protocol objects")
    protos = [ComparedProtocol.from_dict(p) for p in spec]
    tables = compare_protocol_files(protos, metric=args.metric, n_resamples=args.n_resamples, ci=args.ci,
                                    seed=args.seed)
    config = {"protocols": spec, "metric": args.metric, "n_resamples": args.n_resamples, "ci": args.ci,
              "seed": args.seed}
    meta = provenance(config, args.seed, inputs=_inputs(protocol_files(protos)), reference=protos[0].name,
                      protocols=[p.name for p in protos], metric=args.metric)
    for key, path in (("comparison", args.out), ("ranks", args.ranks_out), ("reversals", args.reversals_out)):
        write_parquet(path, tables[key], meta={**meta, "table": f"protocol_{key}"})
    ref = tables["comparison"][tables["comparison"]["reference"]]
    for r in ref.itertuples():
        print(f"protocol-comparison: {r.protocol_a} vs {r.protocol_b}: tau = {r.tau:.3f} "
              f"[{r.tau_ci_low:.3f}, {r.tau_ci_high:.3f}] over {r.n_methods} methods, {r.n_reversals} reversal(s), "
              f"best {r.best_a} -> {r.best_b} (P(change) = {r.p_best_changes:.3f})")
    print(f"protocol-comparison: {len(protos)} protocols -> {args.out}")
    return 0


def _inputs(paths) -> list[dict]:
    out = []
    for p in paths:
        meta = read_parquet_meta(p) if Path(p).is_file() else {}
        out.append({"path": str(p), "code_version": meta.get("code_version")})
    return out
