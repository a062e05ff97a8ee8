"""Severity ladders (docs/protocol.md#severity-ladders; MapShift's graded shifts).

A ladder is a small training rule set T and, per level d, test rules at EXACT rule-table Hamming distance d
from T: d(z, T) = min over t in T of the number of neighbourhoods on which z and t differ.

Mirror classes. T must be mirror-closed (with a rule, its mirror). Reflection permutes the entries of a rule
table, so it preserves Hamming distances, and then d(mirror(z), T) = d(z, mirror(T)) = d(z, T): a rule and its
mirror always sit on the same level, no level holds a training rule or its mirror, and a level is filled with
whole mirror classes.

Levels. Per level, the classes at distance d are taken in a seeded order (numpy default_rng seeded by
(seed, d), so a level does not change when other levels or sizes change); a class that would overshoot the
remaining room is passed over for the next one that fits, so a level has exactly `level_size` rules whenever the
shell allows it (else the last class overshoots by one rule, recorded in `overshoot`). Too few rules at
distance d: `LadderError` naming the level.

Candidates. Families with at most `EXACT_ENUMERATION_LIMIT` rules (the elementary one) enumerate every rule,
so a level is a uniform draw of the classes in its shell. Larger families (k = 3: 3^27 rules) mutate: a
random training rule, d distinct table entries each changed to another random colour; the candidate is kept
when its exact distance to all of T is d (it is at most d by construction). Mutation sampling is not uniform
over the shell: rules near fewer training rules are drawn less often.

The training set: an explicit rule list, or `train_classes` mirror classes drawn with default_rng(seed)
(optionally cycling over rule types: class i from type train_types[i mod len], for families with features).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.rules.features import RULE_TYPES, read_features
from tapebench.splits.generate import SPLIT_NAME_PATTERN
from tapebench.splits.io import save_split
from tapebench.utils.io import provenance
from tapebench.vocabulary import ladder_side

EXACT_ENUMERATION_LIMIT = 2 ** 16     # families up to this many rules enumerate every rule
MUTATION_ATTEMPTS_PER_RULE = 200      # mutation sampling gives up after level_size * this many candidates
MAX_LEVEL_SIZE = 512


class LadderError(ValueError):
    """A ladder cannot be built as asked; the message names the level or the rule."""


def check_mirror_closed(family: RuleFamily, train) -> list[int]:
    """The training rules, sorted; raises naming the rules whose mirror is missing."""
    train = sorted(set(family.check_rules(train)))
    missing = [(z, family.mirror_rule(z)) for z in train if family.mirror_rule(z) not in set(train)]
    if missing:
        pairs = ", ".join(f"{z} (mirror {m})" for z, m in missing)
        raise LadderError(f"the ladder's training set must be mirror-closed (a rule and its mirror are the same task, "
                          f"and distances are mirror-invariant only then); missing mirrors of {pairs}: add them, "
                          f"or draw the training set with train_classes")
    return train


def distances_to(family: RuleFamily, rules, train) -> np.ndarray:
    """Exact d(z, T) = min over t in T of the table Hamming distance, for each z in `rules`."""
    rule_tables = family.tables(rules)
    train_tables = family.tables(train)
    return (rule_tables[:, None, :] != train_tables[None, :, :]).sum(axis=2).min(axis=1)


def _level_rng(seed: int, d: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(d)]))


def _classes(family: RuleFamily, rules) -> list[tuple[int, ...]]:
    members: dict[int, set[int]] = {}
    for z in rules:
        members.setdefault(family.class_representative(z), set()).update((z, family.mirror_rule(z)))
    return [tuple(sorted(members[rep])) for rep in sorted(members)]


def _fill(classes: list[tuple[int, ...]], order, size: int) -> list[tuple[int, ...]]:
    """Classes in `order`, passing over one that would overshoot while a fitting one remains."""
    picked, covered, free = [], 0, [classes[i] for i in order]
    while covered < size and free:
        fitting = [c for c in free if len(c) <= size - covered]
        unit = fitting[0] if fitting else free[0]
        free.remove(unit)
        picked.append(unit)
        covered += len(unit)
    return picked


def _unfillable(d: int, found: int, n_train: int, level_size: int, how: str) -> LadderError:
    return LadderError(f"level d={d} has only {found} rules at exact distance {d} from the {n_train} training rules "
                       f"{how}; use a smaller training set or a smaller level_size (asked {level_size})")


def _exact_level(family, train, d, level_size, seed, all_distances) -> list[int]:
    shell = [z for z, dist in enumerate(all_distances) if dist == d]
    if len(shell) < level_size:
        raise _unfillable(d, len(shell), len(train), level_size, f"(all {family.num_rules} rules enumerated)")
    classes = _classes(family, shell)
    order = _level_rng(seed, d).permutation(len(classes))
    return sorted(z for c in _fill(classes, order, level_size) for z in c)


def _mutated_level(family, train, d, level_size, seed) -> list[int]:
    if d > family.neighbourhoods:
        raise _unfillable(d, 0, len(train), level_size, f"(a rule table has {family.neighbourhoods} entries)")
    rng = _level_rng(seed, d)
    train_tables = family.tables(train)
    chosen: list[tuple[int, ...]] = []
    seen: set[int] = set(train)
    covered, spare = 0, None
    for _ in range(level_size * MUTATION_ATTEMPTS_PER_RULE):
        if covered >= level_size:
            break
        table = train_tables[rng.integers(len(train))].copy()
        entries = rng.choice(family.neighbourhoods, size=d, replace=False)
        table[entries] = (table[entries] + rng.integers(1, family.k, size=d)) % family.k
        z = family.number(table)
        if z in seen:
            continue
        cls = tuple(sorted({z, family.mirror_rule(z)}))
        seen.update(cls)
        if int((train_tables != table).sum(axis=1).min()) != d:
            continue
        if len(cls) > level_size - covered:
            spare = spare or cls    # a pair with one slot left: look on for a self-mirror rule
            continue
        chosen.append(cls)
        covered += len(cls)
    if covered < level_size and spare is not None:
        chosen.append(spare)        # none found: the level overshoots by one rule
        covered += len(spare)
    if covered < level_size:
        raise _unfillable(d, covered, len(train), level_size,
                          f"(found by mutation sampling in {level_size * MUTATION_ATTEMPTS_PER_RULE} candidates)")
    return sorted(z for c in chosen for z in c)


def ladder_levels(family: RuleFamily, train, levels, level_size: int, seed: int = 0) -> dict[int, list[int]]:
    """{d: sorted test rules at exact distance d from `train`} for each d in `levels` (see the module docstring)."""
    train = check_mirror_closed(family, train)
    levels = sorted(set(int(d) for d in levels))
    bad = [d for d in levels if not 1 <= d <= family.neighbourhoods]
    if not levels or bad:
        raise LadderError(f"ladder levels must be distances in 1..{family.neighbourhoods} (the entries of a rule "
                          f"table of {family.describe()}), got {bad or 'none'}")
    if isinstance(level_size, bool) or not isinstance(level_size, (int, np.integer)) \
            or not 1 <= level_size <= MAX_LEVEL_SIZE:
        raise LadderError(f"level_size must be an integer in 1..{MAX_LEVEL_SIZE}, got {level_size!r}")
    if family.num_rules <= EXACT_ENUMERATION_LIMIT:
        all_distances = distances_to(family, range(family.num_rules), train)
        return {d: _exact_level(family, train, d, level_size, seed, all_distances) for d in levels}
    return {d: _mutated_level(family, train, d, level_size, seed) for d in levels}


def draw_training_set(family: RuleFamily, n_classes: int, seed: int = 0, *, types: dict[int, str] | None = None,
                      type_cycle=()) -> list[int]:
    """`n_classes` mirror classes (their rules, sorted) drawn with default_rng(seed); with `type_cycle`, class i
    is drawn among the classes of type type_cycle[i mod len] (`types`: {rule: type}, the rule features)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7E41]))
    type_cycle = list(type_cycle)
    if family.num_rules > EXACT_ENUMERATION_LIMIT:
        if type_cycle:
            raise LadderError(f"drawing training classes by type needs the features of every rule; {family.describe()} "
                              f"has {family.num_rules} rules: give the training rules explicitly")
        picked: set[int] = set()
        while len({family.class_representative(z) for z in picked}) < n_classes:
            table = rng.integers(0, family.k, size=family.neighbourhoods)
            z = family.number(table)
            picked.update((z, family.mirror_rule(z)))
        return sorted(picked)
    classes = _classes(family, range(family.num_rules))
    if not type_cycle:
        order = rng.permutation(len(classes))[:n_classes]
        return sorted(z for i in order for z in classes[i])
    if types is None:
        raise LadderError("drawing training classes by type needs the rule types (the features file)")
    unknown = sorted(set(type_cycle) - set(RULE_TYPES))
    if unknown:
        raise LadderError(f"unknown rule types {unknown} in train_types; allowed: {list(RULE_TYPES)}")
    pools = {t: [c for c in classes if types.get(c[0]) == t] for t in dict.fromkeys(type_cycle)}
    wanted = Counter(type_cycle[i % len(type_cycle)] for i in range(n_classes))
    short = {t: (n, len(pools[t])) for t, n in wanted.items() if n > len(pools[t])}
    if short:
        text = ", ".join(f"{t}: {n} asked, {have} exist" for t, (n, have) in short.items())
        raise LadderError(f"not enough mirror classes of the asked types ({text})")
    rules = []
    for t in dict.fromkeys(type_cycle):
        order = rng.permutation(len(pools[t]))[:wanted[t]]
        rules.extend(z for i in order for z in pools[t][i])
    return sorted(rules)


@dataclass(frozen=True)
class LadderParams:
    """Generator parameters of a ladder split; recorded in the artifact's `params`."""

    name: str
    train: tuple[int, ...] = ()           # explicit mirror-closed training rules; empty: draw train_classes
    train_classes: int = defaults.LADDER_TRAIN_CLASSES
    train_types: tuple[str, ...] = ()     # cycle of rule types for the drawn classes; empty: any type
    levels: tuple[int, ...] = defaults.LADDER_LEVELS
    level_size: int = defaults.LADDER_LEVEL_SIZE
    seed: int = 0
    family: RuleFamily = ELEMENTARY

    def __post_init__(self):
        if not isinstance(self.name, str) or not SPLIT_NAME_PATTERN.match(self.name):
            raise ValueError(f"split name must be letters, digits, '_', '.', '-' (a file name), got {self.name!r}")
        object.__setattr__(self, "train", tuple(sorted(set(int(z) for z in self.train))))
        object.__setattr__(self, "levels", tuple(sorted(set(int(d) for d in self.levels))))
        object.__setattr__(self, "train_types", tuple(self.train_types))
        if not self.train and (isinstance(self.train_classes, bool) or not isinstance(self.train_classes, int)
                               or self.train_classes < 1):
            raise ValueError(f"train_classes must be a positive integer, got {self.train_classes!r}")

    def as_dict(self) -> dict:
        return {"name": self.name, "train": list(self.train), "train_classes": None if self.train else
                int(self.train_classes), "train_types": list(self.train_types), "levels": list(self.levels),
                "level_size": int(self.level_size), "seed": int(self.seed), "family": self.family.as_dict()}


def training_rules(params: LadderParams, types: dict[int, str] | None = None) -> list[int]:
    if params.train:
        return check_mirror_closed(params.family, params.train)
    return draw_training_set(params.family, params.train_classes, params.seed, types=types,
                             type_cycle=params.train_types)


def make_ladder_split(params: LadderParams, features: pd.DataFrame, features_meta: dict | None = None) -> dict:
    """The ladder split payload: a split whose `test` is the union of its `levels` (everything but the hash)."""
    features_meta = features_meta or {}
    feature_names = list(features_meta.get("config", {}).get("feature_names")
                         or [c for c in features.columns if c not in ("rule", "mirror_rule", "mirror_class", "type")])
    by_rule = features.set_index("rule")
    types_all = {int(z): str(t) for z, t in by_rule["type"].items()}
    train = training_rules(params, types_all)
    levels = ladder_levels(params.family, train, params.levels, params.level_size, params.seed)
    test = sorted(z for rules in levels.values() for z in rules)
    rules = sorted(set(train) | set(test))
    missing = [z for z in rules if z not in by_rule.index]
    if missing:
        raise ValueError(f"features have no row for rules {missing[:10]}; regenerate the features for the family")
    types = {str(z): types_all[z] for z in rules}
    type_counts = Counter(types[str(z)] for z in test)
    distances = distances_to(params.family, test, train)
    protocol = features_meta.get("config", {}).get("protocol", {})
    return {
        "name": params.name,
        "kind": "ladder",
        "family": params.family.as_dict(),
        "train": train,
        "test": test,
        "levels": {str(d): levels[d] for d in params.levels},
        "distances": {str(z): int(dist) for z, dist in zip(test, distances)},
        "types": types,
        "features": {str(z): [float(by_rule.at[z, c]) for c in feature_names] for z in rules},
        "feature_names": feature_names,
        "params": {**params.as_dict(), "feature_protocol": protocol},
        "unit": "mirror_class",
        "test_type_counts": {t: int(type_counts.get(t, 0)) for t in RULE_TYPES},
        "level_type_counts": {ladder_side(d): {t: sum(types[str(z)] == t for z in levels[d]) for t in RULE_TYPES}
                              for d in params.levels},
        "overshoot": {ladder_side(d): len(levels[d]) - params.level_size for d in params.levels},
        "provenance": provenance({"ladder": params.as_dict(), "feature_protocol": protocol}, seed=params.seed,
                                 features_code_version=features_meta.get("code_version")),
    }


def generate_ladder_split(params: LadderParams, features_path, out_path) -> dict:
    frame, meta = read_features(features_path)
    return save_split(out_path, make_ladder_split(params, frame, meta))


def shell_sizes(family: RuleFamily, train) -> dict[int, int]:
    """Rules at each exact distance from `train` (enumerating families only): {d: count}, d = 0 the training set."""
    if family.num_rules > EXACT_ENUMERATION_LIMIT:
        raise LadderError(f"{family.describe()} has {family.num_rules} rules; shell sizes need enumeration")
    counts = Counter(int(d) for d in distances_to(family, range(family.num_rules), train))
    return {d: counts.get(d, 0) for d in range(family.neighbourhoods + 1)}


