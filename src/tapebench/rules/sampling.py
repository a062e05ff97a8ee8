"""Seeded rule sets for large families, stratified by Langton's lambda (docs/protocol.md#rule-sets).

A family with k colours and radius r has k^(k^(2r+1)) rules (3^27 for k = 3, r = 1), so its benchmark
runs on a sampled rule set. `sample_rule_set` draws `n` mirror classes (a rule and its mirror are the
same task; every class is kept whole, so the set holds between n and 2n rules), spread evenly over
Langton's lambda bins (the remainder of n / bins goes to the lowest bins). A bin [lo, hi) holds the
rules whose lambda lies in it; the last bin is closed, [lo, 1].

Sub-families. The rule table is a function of a *key* of the neighbourhood: the neighbourhood itself
(all rules), its sum (totalistic) or (centre cell, sum of the other cells) (outer-totalistic). The
sampler draws the table on the key's values, so a totalistic draw is totalistic by construction (no
rejection from the full space). A key value that maps to a non-zero colour contributes its number of
neighbourhoods to lambda.

One draw in a bin: (1) a lambda value uniformly among the values the sub-family can reach inside the
bin; (2) a uniformly random set of key values with exactly that weight; (3) a uniform non-zero colour
for each of them (colour 0 for the others). A drawn class already in the set is drawn again; a bin that
cannot supply its classes within `max_draws_per_class` draws per class fails with an error naming the
bin. For sub-families small enough to enumerate (<= 2^16 rules) the number of mirror classes per bin
is counted first, so an impossible request fails at once with the exact count.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from pathlib import Path

import numpy as np

from tapebench.rule_family import RuleFamily, family_from_config
from tapebench.utils.artifacts import CorruptArtifact, read_json
from tapebench.utils.io import provenance, write_json
from tapebench.validation import check_integer

SUBFAMILIES = ("all", "totalistic", "outer_totalistic")
MAX_SAMPLE = 10_000            # mirror classes in a sampled rule set
MAX_BINS = 100
MAX_ENUMERATED_KEY_VALUES = 20   # key tables up to 2^20 non-zero patterns are enumerated
MAX_ENUMERATED_RULES = 1 << 16   # sub-families up to this size are counted exactly per bin
DEFAULT_MAX_DRAWS_PER_CLASS = 200


def lambda_edges(bins) -> tuple[float, ...]:
    """Bin edges from a number of equal bins over [0, 1] or an explicit increasing list within [0, 1]."""
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        n = check_integer(bins, "lambda_bins", minimum=1, maximum=MAX_BINS)
        return tuple(float(Fraction(i, n)) for i in range(n + 1))
    try:
        edges = [float(e) for e in bins]
    except (TypeError, ValueError):
        raise ValueError(f"lambda_bins must be a number of equal bins (1..{MAX_BINS}) or a list of edges in "
                         f"[0, 1], got {bins!r}") from None
    if not 2 <= len(edges) <= MAX_BINS + 1 or any(not 0.0 <= e <= 1.0 for e in edges) \
            or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"lambda_bins edges must be 2..{MAX_BINS + 1} strictly increasing numbers in [0, 1], "
                         f"got {bins!r}")
    return tuple(edges)


def bin_of(lam, edges) -> int | None:
    """Index of the bin holding lambda ([lo, hi), the last one [lo, hi]); None outside every bin."""
    lam = Fraction(lam)
    last = len(edges) - 2
    for i in range(last + 1):
        lo, hi = Fraction(edges[i]), Fraction(edges[i + 1])
        if lo <= lam < hi or (i == last and lam == hi):
            return i
    return None


def bin_text(edges, i: int) -> str:
    closing = "]" if i == len(edges) - 2 else ")"
    return f"[{edges[i]:g}, {edges[i + 1]:g}{closing}"


@dataclass(frozen=True)
class SampleSpec:
    """What to sample (the config section `rule_set.sample`)."""

    n: int
    """mirror classes in the set (each kept whole: between n and 2n rules)"""
    lambda_bins: object = 5
    """number of equal lambda bins over [0, 1], or a list of bin edges"""
    subfamily: str = "all"
    """'all', 'totalistic' or 'outer_totalistic'"""
    seed: int = 0
    max_draws_per_class: int = DEFAULT_MAX_DRAWS_PER_CLASS

    def __post_init__(self):
        check_integer(self.n, "rule_set.sample.n", minimum=1, maximum=MAX_SAMPLE)
        object.__setattr__(self, "lambda_bins", list(self.lambda_bins) if not isinstance(
            self.lambda_bins, (int, np.integer)) else int(self.lambda_bins))
        lambda_edges(self.lambda_bins)
        if self.subfamily not in SUBFAMILIES:
            raise ValueError(f"rule_set.sample.subfamily must be one of {list(SUBFAMILIES)}, got {self.subfamily!r}")
        check_integer(self.seed, "rule_set.sample.seed", minimum=0)
        check_integer(self.max_draws_per_class, "max_draws_per_class", minimum=1, maximum=100_000)

    @property
    def edges(self) -> tuple[float, ...]:
        return lambda_edges(self.lambda_bins)

    def per_bin(self) -> list[int]:
        bins = len(self.edges) - 1
        return [self.n // bins + (1 if i < self.n % bins else 0) for i in range(bins)]

    def as_dict(self) -> dict:
        return {"n": int(self.n), "lambda_bins": self.lambda_bins, "subfamily": self.subfamily,
                "seed": int(self.seed)}


class KeyedTables:
    """Rule tables of a sub-family as functions of a neighbourhood key (see the module docstring)."""

    def __init__(self, family: RuleFamily, subfamily: str):
        self.family, self.subfamily = family, subfamily
        if subfamily == "all":
            key = np.arange(family.neighbourhoods)
        elif subfamily == "totalistic":
            key = family.neighbourhood_sums
        else:
            outer = family.neighbourhood_sums - family.centre_cells
            key = family.centre_cells * (2 * family.r * (family.k - 1) + 1) + outer
        values, self.key = np.unique(key, return_inverse=True)
        self.weights = np.bincount(self.key)            # neighbourhoods per key value
        self.size = len(values)

    @property
    def uniform(self) -> bool:
        return bool(np.all(self.weights == 1))

    @property
    def num_rules(self) -> int:
        return self.family.k ** self.size

    @cached_property
    def _subsets_by_weight(self) -> dict[int, np.ndarray]:
        """Non-zero patterns (bit masks over key values) grouped by their lambda weight."""
        if self.size > MAX_ENUMERATED_KEY_VALUES:
            raise ValueError(f"{self.subfamily} rules of {self.family.describe()} have {self.size} table "
                             f"entries; lambda-stratified sampling enumerates at most "
                             f"{MAX_ENUMERATED_KEY_VALUES} (use subfamily 'all' or a smaller family)")
        masks = np.arange(1 << self.size, dtype=np.int64)
        bits = (masks[:, None] >> np.arange(self.size)) & 1
        weight = bits @ self.weights
        order = np.argsort(weight, kind="stable")
        cuts = np.flatnonzero(np.diff(weight[order])) + 1
        return {int(weight[g[0]]): g for g in np.split(masks[order], cuts)}

    def weights_in_bin(self, lo: Fraction, hi: Fraction, closed: bool) -> list[int]:
        """Reachable lambda weights (non-zero neighbourhoods) with lambda in the bin."""
        total = self.family.neighbourhoods
        reachable = range(total + 1) if self.uniform else sorted(self._subsets_by_weight)
        return [w for w in reachable if lo <= Fraction(w, total) and (Fraction(w, total) < hi
                                                                      or (closed and Fraction(w, total) == hi))]

    def draw(self, rng: np.random.Generator, weight: int) -> int:
        """A rule of the sub-family with exactly `weight` non-zero neighbourhoods."""
        if self.uniform:
            nonzero = rng.choice(self.size, size=weight, replace=False)
        else:
            masks = self._subsets_by_weight[weight]
            mask = int(masks[rng.integers(len(masks))])
            nonzero = [i for i in range(self.size) if mask >> i & 1]
        values = np.zeros(self.size, dtype=np.uint8)
        values[np.asarray(nonzero, dtype=np.int64)] = rng.integers(1, self.family.k, size=len(nonzero))
        return self.family.number(values[self.key])

    def all_rules(self):
        """Every rule of the sub-family (only for small ones)."""
        for digits in np.ndindex(*(self.family.k,) * self.size):
            yield self.family.number(np.asarray(digits, dtype=np.uint8)[self.key])


def _classes_per_bin(tables: KeyedTables, edges) -> list[int]:
    family = tables.family
    classes: list[set] = [set() for _ in range(len(edges) - 1)]
    for rule in tables.all_rules():
        b = bin_of(Fraction(int(np.count_nonzero(family.table(rule))), family.neighbourhoods), edges)
        if b is not None:
            classes[b].add(family.class_representative(rule))
    return [len(c) for c in classes]


def sample_rule_set(family: RuleFamily, spec: SampleSpec) -> dict:
    """The sampled rule set: sorted rules plus, per rule, lambda, bin and mirror class; deterministic per seed."""
    edges = spec.edges
    tables = KeyedTables(family, spec.subfamily)
    wanted = spec.per_bin()
    if tables.num_rules <= MAX_ENUMERATED_RULES:
        available = _classes_per_bin(tables, edges)
        short = [(i, a, w) for i, (a, w) in enumerate(zip(available, wanted)) if a < w]
        if short:
            text = "; ".join(f"bin {i} {bin_text(edges, i)} has {a} mirror classes, {w} requested"
                             for i, a, w in short)
            raise ValueError(f"cannot sample {spec.n} mirror classes of {spec.subfamily} rules of "
                             f"{family.describe()} over {len(wanted)} lambda bins: {text}; use a smaller n "
                             f"or fewer bins")
    rng = np.random.default_rng(spec.seed)
    total = family.neighbourhoods
    picked: dict[int, int] = {}        # class representative -> bin
    for b, count in enumerate(wanted):
        lo, hi = Fraction(edges[b]), Fraction(edges[b + 1])
        weights = tables.weights_in_bin(lo, hi, closed=b == len(wanted) - 1)
        if count and not weights:
            raise ValueError(f"lambda bin {b} {bin_text(edges, b)} holds no {spec.subfamily} rule of "
                             f"{family.describe()} (lambda takes values j/{total}); widen the bin or use fewer bins")
        got, draws = 0, 0
        while got < count:
            if draws >= spec.max_draws_per_class * count:
                raise ValueError(f"lambda bin {b} {bin_text(edges, b)} gave only {got} new mirror "
                                 f"classes of the {count} requested in {draws} draws ({spec.subfamily} rules of "
                                 f"{family.describe()}); use a smaller n or wider bins")
            draws += 1
            rule = tables.draw(rng, int(weights[rng.integers(len(weights))]))
            rep = family.class_representative(rule)
            if rep not in picked:
                picked[rep] = b
                got += 1
    rows = []
    for rep, b in picked.items():
        for rule in sorted({rep, family.mirror_rule(rep)}):
            rows.append({"rule": rule, "mirror_class": rep, "lambda": family.langton_lambda(rule), "bin": b})
    rows.sort(key=lambda row: row["rule"])
    return {"family": family.as_dict(), "sample": spec.as_dict(), "lambda_edges": list(edges),
            "rules": [row["rule"] for row in rows], "per_rule": rows,
            "classes_per_bin": [sum(1 for v in picked.values() if v == b) for b in range(len(wanted))]}


def spec_from_config(section: dict) -> SampleSpec:
    """The sample of a config section {n, lambda_bins, subfamily, seed}."""
    unknown = sorted(set(section) - {"n", "lambda_bins", "subfamily", "seed"})
    if unknown:
        raise ValueError(f"rule_set.sample accepts n, lambda_bins, subfamily, seed; got unknown keys {unknown}")
    if "n" not in section:
        raise ValueError("rule_set.sample needs n, the number of mirror classes to sample")
    return SampleSpec(**section)


def write_rule_set(path, family: RuleFamily, spec: SampleSpec) -> dict:
    if not family.fits_int64:
        raise ValueError(f"the pipeline stores rule numbers as int64 and supports families whose rules fit 64 "
                         f"bits; {family.describe()} does not (use k = 3, r = 1, k = 2, r = 2 or the elementary "
                         f"family)")
    rule_set = sample_rule_set(family, spec)
    rule_set["provenance"] = provenance({"family": family.as_dict(), "sample": spec.as_dict()}, seed=spec.seed)
    write_json(path, rule_set)
    return rule_set


def read_rule_set(path) -> tuple[RuleFamily, list[int], dict]:
    """(family, rules, payload) of a rule-set artifact; a damaged file names its path."""
    raw = read_json(Path(path), "rule set", writer="tapebench rule-set")
    if not isinstance(raw, dict) or not {"family", "rules"} <= set(raw):
        raise CorruptArtifact(Path(path), "not a rule-set file: expected a JSON object with 'family' and 'rules' "
                                          "(written by `tapebench rule-set`)")
    family = family_from_config(raw["family"])
    return family, family.check_rules(raw["rules"]), raw
