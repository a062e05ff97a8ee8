"""Outer-totalistic rules on an n × n torus, in Golly's notation (docs/protocol.md#grid).

A rule is a birth set B and a survival set S of live-neighbour counts: a cell becomes 1 iff it is 0 and its
count is in B, or it is 1 and its count is in S. The neighbourhood is part of the rule: **Moore** (the 8
surrounding cells, counts 0..8; written `B3/S23`) or **von Neumann** (the 4 orthogonal cells, counts 0..4;
written with the suffix `V`, `B1/S12V`). A `GridFamily` is one neighbourhood and its rules, as `RuleFamily`
is for tapes.

**Rule id** (within its family, m = 8 or 4 neighbours): the rule table T[state, count] (state 0 or 1, count
0..m) numbered like a Wolfram rule, `id = Σ T[state, count] · 2^(state·(m+1) + count)`. So bits 0..m are B
and bits m+1..2m+1 are S: `id = Σ_{b∈B} 2^b + Σ_{s∈S} 2^(m+1+s)`. Moore ids are 0..2^18 − 1 (Conway's
`B3/S23` is 6152), von Neumann ids 0..2^10 − 1. An id alone does not say its neighbourhood: `GridRule`
carries both, and `GridFamily.rule(id)` reads an id in one family.

**Notation accepted**: `B<digits>/S<digits>` with an optional `V` suffix; the letters in either case; the
digits of a set in any order (as Golly accepts them), each at most once (a repeated digit is refused as a
likely typo); either set may be empty (`B/S` is id 0). `str(rule)` is the canonical form: upper-case
letters, sorted digits.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

MOORE_NAME, VON_NEUMANN_NAME = "moore", "von_neumann"
NOTATION = re.compile(r"B([0-9]*)/S([0-9]*)(V?)", re.IGNORECASE)
EXAMPLES = "e.g. 'B3/S23' (Moore) or 'B1/S12V' (von Neumann)"


@dataclass(frozen=True)
class GridFamily:
    """The outer-totalistic rules of one neighbourhood: `MOORE` (8 neighbours) or `VON_NEUMANN` (4)."""

    name: str

    def __post_init__(self):
        if self.name not in (MOORE_NAME, VON_NEUMANN_NAME):
            raise ValueError(f"neighbourhood must be {MOORE_NAME!r} or {VON_NEUMANN_NAME!r}, got {self.name!r}")

    @property
    def neighbours(self) -> int:
        """Cells in the neighbourhood, m: 8 (Moore) or 4 (von Neumann)."""
        return 8 if self.name == MOORE_NAME else 4

    @property
    def counts(self) -> int:
        """Possible live-neighbour counts, m + 1."""
        return self.neighbours + 1

    @property
    def num_rules(self) -> int:
        """2^(2(m+1)): 262,144 Moore rules, 1,024 von Neumann rules."""
        return 1 << (2 * self.counts)

    @property
    def suffix(self) -> str:
        """The notation's suffix: '' (Moore) or 'V' (von Neumann)."""
        return "" if self.name == MOORE_NAME else "V"

    @cached_property
    def offsets(self) -> tuple[tuple[int, int], ...]:
        """(row, column) offsets of the neighbours."""
        if self.name == VON_NEUMANN_NAME:
            return ((-1, 0), (0, -1), (0, 1), (1, 0))
        return tuple((dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0))

    def describe(self) -> str:
        return f"{self.name} neighbourhood ({self.neighbours} neighbours, ids 0..{self.num_rules - 1})"

    def check_id(self, rule_id) -> int:
        if isinstance(rule_id, (bool, np.bool_)) or not isinstance(rule_id, (int, np.integer)) \
                or not 0 <= int(rule_id) < self.num_rules:
            raise ValueError(f"a rule id of the {self.describe()} must be an integer in 0..{self.num_rules - 1}, "
                             f"got {rule_id!r}")
        return int(rule_id)

    def rule(self, rule) -> "GridRule":
        """A rule of this family from an id, the notation or a `GridRule` (the error says what is allowed)."""
        if isinstance(rule, GridRule):
            found = rule
        elif isinstance(rule, str):
            found = parse_rule(rule)
        else:
            rule_id = self.check_id(rule)
            m = self.counts
            found = GridRule(self, frozenset(c for c in range(m) if rule_id >> c & 1),
                             frozenset(c for c in range(m) if rule_id >> (m + c) & 1))
        if found.family != self:
            raise ValueError(f"rule {str(found)!r} has the {found.family.name} neighbourhood, but the "
                             f"{self.name} neighbourhood was asked for")
        return found

    def rules(self, rules) -> list["GridRule"]:
        """A non-empty collection of rules of this family (ids, notation strings or `GridRule`s)."""
        if isinstance(rules, (str, GridRule)) or not hasattr(rules, "__iter__"):
            raise ValueError(f"rules must be a collection of rules ({EXAMPLES}, or ids), got {rules!r}")
        out = [self.rule(rule) for rule in (rules.tolist() if hasattr(rules, "tolist") else rules)]
        if not out:
            raise ValueError(f"a rule set must contain at least one rule ({EXAMPLES}), got an empty set")
        return out

    def table(self, rule) -> np.ndarray:
        """The (2, m + 1) table T[state, count] of one rule."""
        return self.rule(rule).table

    def tables(self, rules) -> np.ndarray:
        """(N, 2, m + 1) uint8 tables T[state, count] of a rule list."""
        return np.stack([self.rule(rule).table for rule in self.rules(rules)])

    # --- what rule features, splits, episodes and the pipeline ask of a family (as of `RuleFamily`;
    # docs/protocol.md#grid-rule-space) ---
    elementary = False
    k = 2               # binary cells
    fits_int64 = True   # ids < 2^18: artifacts store them as int64

    @property
    def name_in_text(self) -> str:
        """'Moore' or 'von Neumann' (captions)."""
        return "Moore" if self.name == MOORE_NAME else "von Neumann"

    def as_dict(self) -> dict:
        """The family as artifacts record it (`rule_family.family_from_config` reads it back)."""
        return {"neighbourhood": self.name}

    def check_rules(self, rules) -> list[int]:
        """A non-empty collection of rules of this family as a list of ids (Python ints)."""
        return [self.rule(rule).id for rule in self.rules(rules)]

    def mirror_rule(self, rule) -> int:
        """Every outer-totalistic rule is isotropic: the grid's symmetries map it to itself (no identification)."""
        return self.rule(rule).id

    def is_self_mirror(self, rule) -> bool:
        return self.mirror_rule(rule) == self.rule(rule).id

    def class_representative(self, rule) -> int:
        return self.rule(rule).id


MOORE = GridFamily(MOORE_NAME)
VON_NEUMANN = GridFamily(VON_NEUMANN_NAME)


@dataclass(frozen=True)
class GridRule:
    """One outer-totalistic rule: its family (neighbourhood), birth counts B and survival counts S."""

    family: GridFamily
    birth: frozenset
    survival: frozenset

    def __post_init__(self):
        if not isinstance(self.family, GridFamily):
            raise ValueError(f"family must be MOORE or VON_NEUMANN, got {self.family!r}")
        for letter, counts in (("B", self.birth), ("S", self.survival)):
            bad = sorted(c for c in counts
                         if not isinstance(c, (int, np.integer)) or not 0 <= c <= self.family.neighbours)
            if bad:
                raise ValueError(f"{letter} counts of the {self.family.name} neighbourhood must be in "
                                 f"0..{self.family.neighbours}, got {bad}")
        object.__setattr__(self, "birth", frozenset(int(c) for c in self.birth))
        object.__setattr__(self, "survival", frozenset(int(c) for c in self.survival))

    @property
    def id(self) -> int:
        """Σ_{b∈B} 2^b + Σ_{s∈S} 2^(m+1+s) (the module docstring)."""
        m = self.family.counts
        return sum(1 << b for b in self.birth) + sum(1 << (m + s) for s in self.survival)

    @cached_property
    def table(self) -> np.ndarray:
        """T[state, count] as (2, m + 1) uint8 (read-only): row 0 is B's indicator, row 1 is S's."""
        table = np.zeros((2, self.family.counts), dtype=np.uint8)
        table[0, sorted(self.birth)] = 1
        table[1, sorted(self.survival)] = 1
        table.flags.writeable = False
        return table

    def __str__(self) -> str:
        return (f"B{''.join(map(str, sorted(self.birth)))}/S{''.join(map(str, sorted(self.survival)))}"
                f"{self.family.suffix}")


def parse_rule(text) -> GridRule:
    """A rule from Golly notation: `B3/S23` (Moore) or `B1/S12V` (von Neumann)."""
    if not isinstance(text, str):
        raise ValueError(f"a grid rule must be a string in Golly notation ({EXAMPLES}), got {text!r}")
    match = NOTATION.fullmatch(text)
    if match is None:
        raise ValueError(f"grid rule {text!r} is not Golly notation B<digits>/S<digits> with an optional "
                         f"suffix V ({EXAMPLES})")
    family = VON_NEUMANN if match.group(3) else MOORE
    sets = []
    for letter, digits in (("B", match.group(1)), ("S", match.group(2))):
        counts = [int(d) for d in digits]
        repeated = sorted({c for c in counts if counts.count(c) > 1})
        if repeated:
            raise ValueError(f"grid rule {text!r}: {letter} lists {repeated} more than once (each count at most once)")
        bad = sorted(c for c in counts if c > family.neighbours)
        if bad:
            raise ValueError(f"grid rule {text!r}: {letter} counts of the {family.name} neighbourhood must be in "
                             f"0..{family.neighbours}, got {bad}")
        sets.append(frozenset(counts))
    return GridRule(family, *sets)


def resolve_rules(rule=None, rules=None, neighbourhood: str | None = None) -> tuple[GridFamily, list[GridRule]]:
    """The family and rule list of an environment's arguments: `rules` (a collection) if given, else `rule`.

    Rules are notation strings, `GridRule`s or ids; ids need the family, `neighbourhood` ('moore', the default
    for ids, or 'von_neumann'). All rules share one neighbourhood; a given `neighbourhood` must agree."""
    candidates = [rule] if rules is None else rules
    if isinstance(candidates, (str, GridRule)) or not hasattr(candidates, "__iter__"):
        raise ValueError(f"rules must be a collection of rules ({EXAMPLES}, or ids), got {candidates!r}")
    candidates = candidates.tolist() if hasattr(candidates, "tolist") else list(candidates)
    if neighbourhood is not None:
        family = GridFamily(neighbourhood)
    else:
        named = [parse_rule(c).family if isinstance(c, str) else c.family for c in candidates
                 if isinstance(c, (str, GridRule))]
        family = named[0] if named else MOORE
    return family, family.rules(candidates)
