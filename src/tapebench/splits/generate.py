"""Split generation (docs/protocol.md#splits): farthest-point ("diverse") and seeded random train/test splits.

Units. By default the rule space is split over mirror classes (a rule and its mirror are the same
task and always land on the same side); `unit="rule"` splits single rules and may leak.

Test size. `test_size` counts rules. Units are taken in the method's order; a unit that would
overshoot the remaining room is passed over for the next one that fits (in practice: with one slot
left, a two-rule class is skipped for the next single-rule class), so the test set has exactly
`test_size` rules whenever any fitting unit remains. If none does, the next unit is taken and the
overshoot is recorded in `selection.overshoot`.

Diverse. Features are standardised over the rules of the rule space (z-scores; a constant column
stays 0). A unit's point is the mean of its members' points (mirror rules have identical features,
so this is the shared point). Farthest-point sampling then picks, each time, the unit whose
Euclidean distance to the nearest already-picked unit is largest (ties: lowest rule number).
Start: with seed 0, the unit farthest from the feature mean (the origin); with seed s > 0, a unit
drawn uniformly by numpy's default_rng(s), which gives further, different farthest-point splits.

Random. Units in the order of default_rng(seed).permutation, filled as above.

Families (docs/protocol.md#rule-sets). A split of a sampled rule set of a family with k colours and
radius r records `family` ({k, r}) and `rule_set` (the sample's parameters); both fields are absent for
the elementary family, so its splits (and their content hashes) are unchanged. Mirror classes are the
family's, and rule numbers stay exact Python ints (int64 in Parquet).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.rules.features import RULE_TYPES, features_family, read_features
from tapebench.rules.mirror import mirror_classes
from tapebench.splits.io import save_split
from tapebench.utils.io import provenance
from tapebench.validation import NUM_RULES, check_integer, check_rules

SPLIT_METHODS = ("diverse", "random")
SPLIT_UNITS = ("mirror_class", "rule")
SPLIT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SplitParams:
    """Generator parameters of one split; recorded in the artifact's `params`."""

    name: str
    """file-safe name: results/splits/<name>.json"""
    method: str = "diverse"
    """'diverse' (farthest-point in standardised feature space) or 'random'"""
    test_size: int = 30
    """number of test rules"""
    seed: int = 0
    """random: permutation seed; diverse: 0 = start farthest from the feature mean, s > 0 = random start"""
    unit: str = "mirror_class"
    """'mirror_class' (default, no mirror leaks) or 'rule' (rule-level, may leak)"""
    rules: tuple[int, ...] = tuple(range(NUM_RULES))
    """the rule space to split"""
    family: RuleFamily = ELEMENTARY
    """the rule family of the rules"""
    rule_set: dict | None = None
    """the sample's parameters when the rule space is a sampled rule set (recorded in the artifact)"""

    def __post_init__(self):
        if not isinstance(self.name, str) or not SPLIT_NAME_PATTERN.match(self.name):
            raise ValueError(f"split name must be letters, digits, '_', '.', '-' (a file name), got {self.name!r}")
        if self.method not in SPLIT_METHODS:
            raise ValueError(f"unknown split method {self.method!r}; allowed: {list(SPLIT_METHODS)}")
        if self.unit not in SPLIT_UNITS:
            raise ValueError(f"unknown split unit {self.unit!r}; allowed: {list(SPLIT_UNITS)}")
        rules = tuple(sorted(set(check_rules(self.rules, self.family))))
        object.__setattr__(self, "rules", rules)
        if len(rules) < 2:
            raise ValueError(f"rule space must hold at least 2 rules to split, got {list(rules)}")
        check_integer(self.test_size, "test_size", minimum=1, maximum=len(rules) - 1)  # train keeps >= 1 rule
        check_integer(self.seed, "seed", minimum=0)

    def as_dict(self) -> dict:
        return {"name": self.name, "method": self.method, "test_size": int(self.test_size),
                "seed": int(self.seed), "unit": self.unit, "rules": format_rule_list(self.rules)}


def format_rule_list(rules) -> str:
    """Sorted rules as ranges, the inverse of validation.parse_rule_list: [0,1,2,3,90] -> '0-3,90'."""
    rules = sorted(set(int(r) for r in rules))
    parts, start = [], None
    for i, rule in enumerate(rules):
        if start is None:
            start = rule
        if i + 1 == len(rules) or rules[i + 1] != rule + 1:
            parts.append(str(start) if start == rule else f"{start}-{rule}")
            start = None
    return ",".join(parts)


def split_units(rules, unit: str, family: RuleFamily = ELEMENTARY) -> list[tuple[int, ...]]:
    """Units of the rule space, sorted by lowest member: mirror classes or single rules."""
    if unit == "rule":
        return [(r,) for r in sorted(set(rules))]
    return mirror_classes(rules, family)


def standardised_features(frame: pd.DataFrame, rules, feature_names) -> np.ndarray:
    """(len(rules), n_features) z-scores over `rules`, rows in `rules` order."""
    values = frame.set_index("rule").loc[list(rules), list(feature_names)].to_numpy(dtype=np.float64)
    mean, std = values.mean(axis=0), values.std(axis=0)
    return (values - mean) / np.where(std > 0, std, 1.0)


def _fits(unit_sizes, order, remaining):
    """First unit in `order` whose size fits the remaining room, else the first one (overshoot)."""
    for u in order:
        if unit_sizes[u] <= remaining:
            return u
    return order[0]


def farthest_point_order(points: np.ndarray, unit_sizes: list[int], test_size: int, start: int) -> list[int]:
    """Farthest-point sampling of unit indices until `test_size` rules are covered."""
    picked, covered = [start], unit_sizes[start]
    nearest = np.linalg.norm(points - points[start], axis=1)
    while covered < test_size:
        free = [u for u in range(len(points)) if u not in picked]
        order = sorted(free, key=lambda u: (-nearest[u], u))      # units are sorted by lowest rule
        unit = _fits(unit_sizes, order, test_size - covered)
        picked.append(unit)
        covered += unit_sizes[unit]
        nearest = np.minimum(nearest, np.linalg.norm(points - points[unit], axis=1))
    return picked


def random_order(unit_sizes: list[int], test_size: int, seed: int) -> list[int]:
    permutation = [int(u) for u in np.random.default_rng(seed).permutation(len(unit_sizes))]
    picked, covered = [], 0
    while covered < test_size:
        order = [u for u in permutation if u not in picked]
        unit = _fits(unit_sizes, order, test_size - covered)
        picked.append(unit)
        covered += unit_sizes[unit]
    return picked


def make_split(params: SplitParams, features: pd.DataFrame, features_meta: dict | None = None) -> dict:
    """The split payload (everything but the content hash) for `params` and a features frame."""
    features_meta = features_meta or {}
    feature_names = list(features_meta.get("config", {}).get("feature_names")
                         or [c for c in features.columns if c not in ("rule", "mirror_rule", "mirror_class", "type")])
    missing = sorted(set(params.rules) - set(features["rule"].tolist()))
    if missing:
        raise ValueError(f"features have no row for rules {format_rule_list(missing)}; "
                         f"regenerate the features for the whole rule space")
    family = features_family(features_meta)
    if family != params.family:
        raise ValueError(f"the features describe {family.describe()} but the split is of {params.family.describe()}; "
                         f"regenerate the features from the split's rule set")
    units = split_units(params.rules, params.unit, family)
    sizes = [len(u) for u in units]
    if params.method == "diverse":
        z = standardised_features(features, params.rules, feature_names)
        row = {r: i for i, r in enumerate(params.rules)}
        points = np.stack([z[[row[r] for r in unit]].mean(axis=0) for unit in units])
        if params.seed == 0:
            norms = np.linalg.norm(points, axis=1)
            start = int(np.flatnonzero(norms == norms.max())[0])
        else:
            start = int(np.random.default_rng(params.seed).integers(len(units)))
        picked = farthest_point_order(points, sizes, params.test_size, start)
    else:
        picked = random_order(sizes, params.test_size, params.seed)

    test = sorted(r for u in picked for r in units[u])
    train = sorted(set(params.rules) - set(test))
    if not train:
        raise ValueError(f"test_size={params.test_size} leaves no training rules after whole-unit selection; "
                         f"use a smaller test size")
    by_rule = features.set_index("rule")
    types = {str(r): str(by_rule.at[r, "type"]) for r in params.rules}
    type_counts = Counter(types[str(r)] for r in test)
    protocol = features_meta.get("config", {}).get("protocol", {})
    family_fields = {}
    if not family.elementary:
        family_fields["family"] = family.as_dict()
    if params.rule_set is not None:
        family_fields["rule_set"] = params.rule_set
    return {
        **family_fields,
        "name": params.name,
        "train": train,
        "test": test,
        "types": types,
        "features": {str(r): [float(by_rule.at[r, c]) for c in feature_names] for r in params.rules},
        "feature_names": feature_names,
        "params": {**params.as_dict(), "feature_protocol": protocol},
        "unit": params.unit,
        "test_type_counts": {t: int(type_counts.get(t, 0)) for t in RULE_TYPES},
        "selection": {"test_units_in_order": [list(units[u]) for u in picked],
                      "overshoot": int(len(test) - params.test_size)},
        "provenance": provenance({"split": params.as_dict(), "feature_protocol": protocol}, seed=params.seed,
                                 features_code_version=features_meta.get("code_version")),
    }


def generate_split(params: SplitParams, features_path, out_path) -> dict:
    """Read features, build the split, write it with its content hash; returns the written dict."""
    frame, meta = read_features(features_path)
    return save_split(out_path, make_split(params, frame, meta))
