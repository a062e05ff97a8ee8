"""`tapebench features`: rule features and operational types (docs/protocol.md#rule-types);
`tapebench identifiability` (docs/protocol.md#identifiability)."""
from __future__ import annotations

from collections import Counter

from tapebench import defaults
from tapebench.layout import SPLITS_DIR
from tapebench.rules.features import RULE_TYPES, FeatureProtocol, write_features
from tapebench.validation import parse_rule_list, seed_argument


def register(sub) -> None:
    feature_defaults = FeatureProtocol()
    p = sub.add_parser("features", description="Run every rule of the rule space from random tapes with no actions, summarise "
                                   "the rollouts' density, activity and entropy into a feature vector per rule, and "
                                   "type each rule stable, periodic or chaotic with the paper's thresholds "
                                   "(docs/protocol.md#rule-types). Writes one row per rule to a Parquet file; the "
                                   "same seed gives the same file.")
    p.add_argument("--out", required=True, help="Parquet file, e.g. results/rules/features.parquet")
    p.add_argument("--seed", type=seed_argument, default=feature_defaults.seed, help="seed of the random start tapes")
    p.add_argument("--trials", type=int, default=feature_defaults.trials, help="random start tapes per rule")
    p.add_argument("--steps", type=int, default=feature_defaults.steps, help="CA updates per rollout")
    p.add_argument("--L", type=int, default=feature_defaults.L, help="tape length")
    p.add_argument("--rules", default="0-255", help="rule space, e.g. '0-255' or '0-127,150'")
    p.add_argument("--rule-set", help="a sampled rule set (`tapebench rule-set`): its family and rules replace --rules")
    p.set_defaults(func=run)

    p = sub.add_parser("rule-set", description="Draw n mirror classes of the family's rules (optionally totalistic or "
                                   "outer-totalistic), spread evenly over Langton's lambda bins, every class whole "
                                   "(docs/protocol.md#rule-sets). Writes a JSON rule set; the same seed gives the "
                                   "same file.")
    p.add_argument("--k", type=int, required=True, help="colours, 2..4")
    p.add_argument("--r", type=int, required=True, help="radius, 1..2")
    p.add_argument("--n", type=int, required=True, help="mirror classes to sample")
    p.add_argument("--lambda-bins", default="5",
                   help="number of equal lambda bins over [0, 1] (e.g. 5) or comma-separated edges (0,0.3,1)")
    p.add_argument("--subfamily", default="all", help="all, totalistic or outer_totalistic (default all)")
    p.add_argument("--seed", type=seed_argument, default=0, help="sampling seed")
    p.add_argument("--out", required=True, help="rule-set JSON, e.g. results/rules/rule_set.json")
    p.set_defaults(func=_rule_set)

    p = sub.add_parser("grid-features", description="Features and operational types of outer-totalistic rules on an "
                                   "n x n torus: Langton's lambda, growth flags, density, activity and entropy of free "
                                   "evolution from random grids, and the cycle each rollout reaches "
                                   "(docs/protocol.md#grid-rule-space). The von Neumann family is enumerated; the "
                                   "Moore family is sampled by lambda bins. The same seeds give the same file.")
    p.add_argument("--family", required=True, choices=["moore", "von_neumann"], help="the neighbourhood")
    p.add_argument("--sample", type=int, help="rules to sample by lambda bins (required for moore; von_neumann "
                                              "without it enumerates all 1,024 rules)")
    p.add_argument("--rules", help="an explicit rule set instead: comma-separated Golly notation or ids, e.g. "
                                   "'B3/S23,B36/S23' (the pipeline's rule_set.rules)")
    p.add_argument("--lambda-bins", default="5", help="lambda bins of the sample: a number of equal bins (default 5) "
                                                      "or comma-separated edges")
    p.add_argument("--no-b0", action="store_true", help="leave the B0 rules out of the sample")
    p.add_argument("--seed", type=seed_argument, default=0, help="sampling seed (default 0)")
    p.add_argument("--feature-seed", type=seed_argument, default=feature_defaults.seed,
                   help="seed of the random start grids")
    p.add_argument("--out", required=True, help="Parquet file, e.g. results/rules/grid_features.parquet")
    p.set_defaults(func=_grid_features)

    p = sub.add_parser("identifiability", description="For every rule of both sides of a split, on the evaluation episodes' initial "
                                   "tapes with uniformly random actions: the number of observed transitions until "
                                   "the rule tables consistent with them are a single rule (H + 1 = not identified "
                                   "within the episode). Writes one row per episode to a Parquet file.")
    p.add_argument("--split", required=True, help="split name (in --splits-dir) or path to a split JSON")
    p.add_argument("--splits-dir", default=SPLITS_DIR, help="where split names are looked up")
    p.add_argument("--L", type=int, default=defaults.L, help=f"tape length (default {defaults.L})")
    p.add_argument("--H", type=int, default=defaults.H, help=f"episode horizon (default {defaults.H})")
    p.add_argument("--episodes-per-rule", type=int, default=defaults.EPISODES_PER_RULE,
                   help=f"episodes per rule (default {defaults.EPISODES_PER_RULE})")
    p.add_argument("--eval-seed", type=int, default=defaults.EVAL_SEED,
                   help=f"evaluation seed of the common-random-number episodes (default {defaults.EVAL_SEED})")
    p.add_argument("--action-seed", type=int, default=0, help="seed of the random-action stream (default 0)")
    p.add_argument("--out", required=True, help="per-episode Parquet, e.g. results/identifiability/main.parquet")
    p.set_defaults(func=_identifiability)


def run(args) -> int:
    protocol = FeatureProtocol(L=args.L, trials=args.trials, steps=args.steps, seed=args.seed)
    if args.rule_set:
        # lazy: a command loads only the modules it runs
        from tapebench.rules.sampling import read_rule_set

        family, rules, raw = read_rule_set(args.rule_set)
        frame = write_features(args.out, protocol, rules, family, rule_set=raw.get("sample"))
    else:
        frame = write_features(args.out, protocol, parse_rule_list(args.rules))
    counts = Counter(frame["type"])
    print(f"wrote {args.out}: {len(frame)} rules, " + ", ".join(f"{t} {counts.get(t, 0)}" for t in RULE_TYPES))
    return 0


def _rule_set(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.rule_family import RuleFamily
    from tapebench.rules.sampling import SampleSpec, write_rule_set

    text = str(args.lambda_bins).strip()
    try:
        bins = int(text) if "," not in text else [float(e) for e in text.split(",")]
    except ValueError:
        raise ValueError(f"--lambda-bins must be a number of bins or comma-separated edges, got {text!r}") from None
    family = RuleFamily(args.k, args.r)
    rule_set = write_rule_set(args.out, family, SampleSpec(n=args.n, lambda_bins=bins, subfamily=args.subfamily,
                                                          seed=args.seed))
    print(f"wrote {args.out}: {len(rule_set['rules'])} rules of {family.describe()} in "
          f"{sum(rule_set['classes_per_bin'])} mirror classes, per lambda bin {rule_set['classes_per_bin']}")
    return 0


def _grid_features(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.grid_rules import GridFamily
    from tapebench.rules.grid_features import GridFeatureProtocol, sample_grid_rules, write_grid_features

    family = GridFamily(args.family)
    if args.rules is not None and args.sample is not None:
        raise ValueError("give --rules or --sample, not both")
    if args.rules is None and args.sample is None and family.num_rules > 1024:
        raise ValueError(f"--sample is required for the {family.describe()}: it is too large to enumerate "
                         f"(or list its rules with --rules)")
    protocol = GridFeatureProtocol(seed=args.feature_seed)
    if args.rules is not None:
        rules = [int(r) if r.strip().isdigit() else r.strip() for r in args.rules.split(",") if r.strip()]
        listed = family.rules(rules)
        repeated = sorted({str(rule) for rule in listed if listed.count(rule) > 1})
        if repeated:
            raise ValueError(f"--rules lists {repeated} more than once")
        frame = write_grid_features(args.out, family, [rule.id for rule in listed], protocol)
    elif args.sample is None:
        frame = write_grid_features(args.out, family, None, protocol)
    else:
        text = str(args.lambda_bins).strip()
        try:
            bins = int(text) if "," not in text else [float(e) for e in text.split(",")]
        except ValueError:
            raise ValueError(f"--lambda-bins must be a number of bins or comma-separated edges, got {text!r}") from None
        sample = sample_grid_rules(family, args.sample, bins, args.seed, allow_b0=not args.no_b0)
        frame = write_grid_features(args.out, family, sample["rules"], protocol, sample=sample["sample"])
    counts = Counter(frame["type"])
    print(f"wrote {args.out}: {len(frame)} {family.name} rules, "
          + ", ".join(f"{t} {counts.get(t, 0)}" for t in RULE_TYPES))
    return 0


def _identifiability(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.health.identifiability import summary_rows, write_identifiability
    from tapebench.validation import check_integer

    check_integer(args.action_seed, "--action-seed", minimum=0)
    check_integer(args.eval_seed, "--eval-seed", minimum=0)
    frame = write_identifiability(args.out, args.split, L=args.L, H=args.H, episodes_per_rule=args.episodes_per_rule,
                                  eval_seed=args.eval_seed, action_seed=args.action_seed, splits_dir=args.splits_dir)
    for row in summary_rows(frame):
        print(f"{row['type']:>9}: {row['rules']} rules, mean {row['mean']:.2f} steps, median {row['median']:.1f}, "
              f"1 step {row['one_step']:.3f}, not identified {row['not_identified']:.3f}")
    print(f"-> {args.out}")
    return 0


