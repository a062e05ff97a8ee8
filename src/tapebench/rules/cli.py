"""`tapebench features`: rule features and operational types (docs/protocol.md#rule-types)."""
from __future__ import annotations

from collections import Counter

from ..validation import parse_rule_list
from .features import RULE_TYPES, FeatureProtocol, write_features


def register(sub) -> None:
    defaults = FeatureProtocol()
    p = sub.add_parser("features", help="per-rule features and operational types (stable / periodic / chaotic)",
                       description="Run every rule of the rule space from random tapes with no actions, summarise "
                                   "the rollouts' density, activity and entropy into a feature vector per rule, and "
                                   "type each rule stable, periodic or chaotic with the paper's thresholds "
                                   "(docs/protocol.md#rule-types). Writes one row per rule to a Parquet file; the "
                                   "same seed gives the same file.")
    p.add_argument("--out", required=True, help="Parquet file, e.g. results/rules/features.parquet")
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the random start tapes")
    p.add_argument("--trials", type=int, default=defaults.trials, help="random start tapes per rule")
    p.add_argument("--steps", type=int, default=defaults.steps, help="CA updates per rollout")
    p.add_argument("--L", type=int, default=defaults.L, help="tape length")
    p.add_argument("--rules", default="0-255", help="rule space, e.g. '0-255' or '0-127,150'")
    p.set_defaults(func=run)


def run(args) -> int:
    protocol = FeatureProtocol(L=args.L, trials=args.trials, steps=args.steps, seed=args.seed)
    frame = write_features(args.out, protocol, parse_rule_list(args.rules))
    counts = Counter(frame["type"])
    print(f"wrote {args.out}: {len(frame)} rules, " + ", ".join(f"{t} {counts.get(t, 0)}" for t in RULE_TYPES))
    return 0
