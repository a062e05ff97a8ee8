"""`tapebench benchmark-health` and `tapebench health-gate` (docs/protocol.md#benchmark-health)."""
from __future__ import annotations

import json

from tapebench import defaults
from tapebench.health.checks import CHECKS


def register(sub) -> None:
    p = sub.add_parser("benchmark-health", description="Six checks on the split's test rules: leakage, reference solvability, "
                                   "weak-baseline headroom, trivially solved rules, rule-dependent headroom, identifiability; each with a "
                                   "status against the thresholds of the config's health: section. Never fails on "
                                   "a check: `tapebench health-gate` turns the report into the pipeline's verdict.")
    p.add_argument("--split", required=True, help="split JSON")
    p.add_argument("--split-health", required=True, help="the split gate's report (tapebench split-health --out)")
    p.add_argument("--reference", required=True, nargs="+",
                   help="reference records on the split's test side: tapebench exact (L <= 20) or tapebench mpc")
    p.add_argument("--random", required=True, nargs="+", help="the random policy's evaluation records (each seed)")
    p.add_argument("--rule-agnostic", nargs="*", default=[],
                   help="evaluation records of the other rule-agnostic rows (live_leftmost, live_random, mpc_prior; "
                        "each seed): with the random policy, the candidates of the rule-agnostic floor")
    p.add_argument("--identifiability", default=None,
                   help="Parquet from `tapebench identifiability` (elementary splits; omitted for another rule "
                        "family, whose identifiability check is then n/a)")
    p.add_argument("--settings", required=True,
                   help="the config's health: section as JSON (inline or a file): trivial_success and, for each of "
                        + ", ".join(c.name for c in CHECKS) + ", {warn, fail, fatal}")
    p.add_argument("--statistics", default=json.dumps({"n_resamples": defaults.N_RESAMPLES, "ci": defaults.CI,
                                                       "seed": defaults.STATISTICS_SEED}),
                   help="bootstrap settings as JSON: n_resamples, ci, seed")
    p.add_argument("--L", type=int, required=True, help="tape length of the records")
    p.add_argument("--H", type=int, required=True, help="horizon of the records")
    p.add_argument("--out", required=True, help="report JSON, e.g. results/health/main.json")
    p.add_argument("--per-rule-out", required=True, help="per-rule Parquet")
    p.set_defaults(func=run_health)

    g = sub.add_parser("health-gate", description="Read a benchmark health report; if a check marked fatal failed, print which "
                                   "gate and which rules and exit non-zero, so the pipeline trains nothing on the "
                                   "split. Otherwise write the verdict file the training jobs wait for.")
    g.add_argument("report", help="report JSON from `tapebench benchmark-health`")
    g.add_argument("--out", required=True, help="verdict JSON, e.g. results/health/main.verdict.json")
    g.set_defaults(func=run_gate)


def run_health(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.health.io import load_settings, write_benchmark_health
    from tapebench.pipeline.params import check_options, check_value

    check_options(args, {"L": "env.L", "H": "evaluation.horizons[]"})
    settings = check_value(load_settings(args.settings), "health", "--settings")
    statistics = check_value(load_settings(args.statistics), "statistics", "--statistics")
    report = write_benchmark_health(split_path=args.split, split_health_path=args.split_health,
                                    reference=args.reference, random=args.random,
                                    identifiability=args.identifiability, settings=settings,
                                    statistics=statistics, L=args.L, H=args.H, out=args.out,
                                    per_rule_out=args.per_rule_out, rule_agnostic=args.rule_agnostic)
    for name, c in report["checks"].items():
        value = "n/a" if c["value"] is None else f"{c['value']:.3f}"
        print(f"{report['split']} {name}: {value} {c['status']}" + (" (fatal)" if c["fatal"] else "")
              + (f" rules {c['rules']}" if c["rules"] else ""))
    return 0


def run_gate(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.health.io import write_verdict
    from tapebench.pipeline.params import check_value
    from tapebench.utils.artifacts import read_json

    report = read_json(args.report, "health report")
    recorded = report.get("provenance", {}).get("config", {}) if isinstance(report, dict) else {}
    for key in ("health", "statistics"):     # the thresholds and bootstrap the report was made with, as the config's
        if isinstance(recorded, dict) and key in recorded:
            check_value(recorded[key], key, f"{args.report}: provenance.config.{key}")
    verdict = write_verdict(args.report, args.out)
    print(f"split {verdict['split']} passes every fatal health gate (status {verdict['status']}"
          + (f"; warnings: {', '.join(verdict['warnings'])}" if verdict["warnings"] else "") + ")")
    return 0
