"""`tapebench split` and `tapebench split-health` (docs/protocol.md#splits)."""
from __future__ import annotations

from tapebench import defaults
from tapebench.splits.generate import SPLIT_METHODS, SPLIT_UNITS, SplitParams, generate_split
from tapebench.splits.health import split_health
from tapebench.validation import parse_rule_list, seed_argument


def register(sub) -> None:
    p = sub.add_parser("split", description="Choose the test rules by farthest-point sampling in feature space (diverse) "
                                   "or at random (seeded), over mirror classes by default so that no test rule "
                                   "has its mirror image in train (docs/protocol.md#splits). Writes the split "
                                   "JSON: train and test rules, their types and features, the generator "
                                   "parameters and a content hash.")
    p.add_argument("--features", required=True, help="features Parquet from `tapebench features`")
    p.add_argument("--name", required=True, help="split name: letters, digits, '_', '.', '-'")
    p.add_argument("--method", default="diverse", help=f"one of {list(SPLIT_METHODS)} (default diverse)")
    p.add_argument("--test-size", type=int, default=30, help="number of test rules")
    p.add_argument("--seed", type=seed_argument, default=0,
                   help="random: permutation seed; diverse: 0 = start farthest from the mean, >0 = random start")
    p.add_argument("--unit", default="mirror_class",
                   help=f"one of {list(SPLIT_UNITS)}; 'rule' may put a rule and its mirror on different sides "
                        f"(default mirror_class)")
    p.add_argument("--rules", default="0-255",
                   help="rule space, e.g. '0-255', or 'sampled': every rule of the features file, which was built "
                        "from a sampled rule set (`tapebench features --rule-set`) or is a 2D grid family's "
                        "(`tapebench grid-features`)")
    p.add_argument("--out", required=True, help="split JSON, e.g. results/splits/main.json")
    p.set_defaults(func=run_split)

    lad = sub.add_parser("ladder-split", description="Choose a small mirror-closed training rule set (explicit, or drawn as mirror "
                                     "classes) and, per level d, test rules whose exact rule-table Hamming distance "
                                     "to the training set is d, in whole mirror classes "
                                     "(docs/protocol.md#severity-ladders). Writes a split JSON whose test side is the "
                                     "union of the levels; it is evaluated per level (sides d1, d2, ...).")
    lad.add_argument("--features", required=True, help="features Parquet from `tapebench features`")
    lad.add_argument("--name", required=True, help="split name: letters, digits, '_', '.', '-'")
    lad.add_argument("--train", default="", help="explicit mirror-closed training rules, e.g. '0,30,86' "
                                                 "(default: draw --train-classes)")
    lad.add_argument("--train-classes", type=int, default=defaults.LADDER_TRAIN_CLASSES,
                     help=f"mirror classes to draw for training (default {defaults.LADDER_TRAIN_CLASSES})")
    lad.add_argument("--train-types", default="",
                     help="draw class i among the classes of type TYPES[i mod n], e.g. 'stable,periodic,chaotic' "
                          "(default: any type)")
    lad.add_argument("--levels", default=",".join(map(str, defaults.LADDER_LEVELS)),
                     help="distances d, e.g. '1,2,3,4' (default)")
    lad.add_argument("--level-size", type=int, default=defaults.LADDER_LEVEL_SIZE,
                     help=f"test rules per level (default {defaults.LADDER_LEVEL_SIZE})")
    lad.add_argument("--seed", type=seed_argument, default=0, help="seed of the training draw and the level sampling")
    lad.add_argument("--out", required=True, help="split JSON, e.g. results/splits/ladder.json")
    lad.set_defaults(func=run_ladder_split)

    h = sub.add_parser("split-health", description="Check a split file: its content hash, no rule on both sides, rules in 0..255, "
                                   "no mirror pair split across the sides (for mirror-class splits); report the "
                                   "rule types on each side. Exits non-zero when the split fails, so the pipeline "
                                   "trains nothing on it.")
    h.add_argument("split", help="split JSON file")
    h.add_argument("--out", help="report JSON (written also when the split fails)")
    h.set_defaults(func=run_health)


def run_split(args) -> int:
    if args.rules == "sampled":
        # lazy: a command loads only the modules it runs
        from tapebench.grid_rules import GridFamily
        from tapebench.rules.features import features_family, read_features

        frame, meta = read_features(args.features)
        family = features_family(meta)
        rule_set = meta.get("config", {}).get("rule_set")
        if isinstance(family, GridFamily):   # the 2D grid family's table is its rule set (sampled, listed or all)
            rule_set = meta["config"].get("sample")
        elif rule_set is None:
            raise ValueError(f"--rules sampled needs features built from a sampled rule set (`tapebench features "
                             f"--rule-set`); {args.features} was not")
        params = SplitParams(name=args.name, method=args.method, test_size=args.test_size, seed=args.seed,
                             unit=args.unit, rules=tuple(int(r) for r in frame["rule"]),
                             family=family, rule_set=rule_set)
    else:
        params = SplitParams(name=args.name, method=args.method, test_size=args.test_size, seed=args.seed,
                             unit=args.unit, rules=tuple(parse_rule_list(args.rules)))
    split = generate_split(params, args.features, args.out)
    counts = ", ".join(f"{t} {n}" for t, n in split["test_type_counts"].items())
    print(f"wrote {args.out}: {len(split['train'])} train / {len(split['test'])} test rules "
          f"(test: {counts}); content hash {split['content_hash'][:12]}")
    return 0


def run_ladder_split(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.splits.ladder import LadderParams, generate_ladder_split

    params = LadderParams(name=args.name, train=tuple(parse_rule_list(args.train)) if args.train.strip() else (),
                          train_classes=args.train_classes,
                          train_types=tuple(t.strip() for t in args.train_types.split(",") if t.strip()),
                          levels=tuple(parse_rule_list(args.levels)), level_size=args.level_size, seed=args.seed)
    split = generate_ladder_split(params, args.features, args.out)
    sizes = ", ".join(f"d={d}: {len(rules)}" for d, rules in split["levels"].items())
    print(f"wrote {args.out}: {len(split['train'])} training rules {split['train']}; levels {sizes}; "
          f"content hash {split['content_hash'][:12]}")
    return 0


def run_health(args) -> int:
    report = split_health(args.split, args.out)
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    sides = "; ".join(f"{side} {report['n_' + side]} ({', '.join(f'{t} {n}' for t, n in c.items())})"
                      for side, c in report["type_counts"].items())
    print(f"split {report['split']} ok: {sides}; mirror leaks {report['mirror_leaks']}")
    return 0
