"""Rule families: k colours, radius r, Wolfram numbering (docs/protocol.md#rule-families).

A rule of the family (k, r) is a table F: [k]^(2r+1) -> [k]. The neighbourhood of cell i is
(x[i-r], ..., x[i+r]) with index `idx = sum_{j=-r..r} x[i+j] * k^(r-j)` (left neighbour most
significant), and the rule number is `N = sum_idx F(idx) * k^idx`. For k = 2, r = 1 this is the
elementary numbering: idx = 4*x[i-1] + 2*x[i] + x[i+1] and F(idx) = (N >> idx) & 1.

Everything that needs to know what a rule is — validation, kernels, mirror classes, features, the
environments, the oracles, the splits — asks a `RuleFamily`. `ELEMENTARY` (k = 2, r = 1) is the default.
Rule numbers are Python integers: for k = 3, r = 1 they go up to 3^27 - 1, for k = 4, r = 1 up to
4^64 - 1 (beyond 64 bits), so artifacts that store rule numbers in int64 columns accept only families
with `fits_int64`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tapebench.grid_rules import GridFamily

MIN_COLOURS, MAX_COLOURS = 2, 4
MIN_RADIUS, MAX_RADIUS = 1, 2
INT64_MAX = 2 ** 63 - 1
QUIESCENT_STATE = 0   # Langton's lambda counts neighbourhoods that do not map to this state


def _check_family_integer(value, name: str, low: int, high: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or not low <= int(value) <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RuleFamily:
    """The rules F: [k]^(2r+1) -> [k] with Wolfram numbering.

    Args:
        k: number of colours (cell states 0..k-1), 2..4.
        r: neighbourhood radius (2r + 1 cells), 1..2.
    """

    k: int = 2
    r: int = 1

    def __post_init__(self):
        object.__setattr__(self, "k", _check_family_integer(self.k, "colours k", MIN_COLOURS, MAX_COLOURS))
        object.__setattr__(self, "r", _check_family_integer(self.r, "radius r", MIN_RADIUS, MAX_RADIUS))

    # --- sizes and names -------------------------------------------------------------------------
    @property
    def width(self) -> int:
        """Cells in a neighbourhood, 2r + 1."""
        return 2 * self.r + 1

    @property
    def neighbourhoods(self) -> int:
        """Entries of a rule table, k^(2r+1)."""
        return self.k ** self.width

    @property
    def num_rules(self) -> int:
        """Rules in the family, k^(k^(2r+1)) (a Python integer; may exceed 64 bits)."""
        return self.k ** self.neighbourhoods

    @property
    def elementary(self) -> bool:
        return self.k == 2 and self.r == 1

    @property
    def fits_int64(self) -> bool:
        """Whether every rule number fits a signed 64-bit integer (artifacts store rules as int64)."""
        return self.num_rules - 1 <= INT64_MAX

    @property
    def name(self) -> str:
        """'eca' for the elementary family, else 'k{k}r{r}' (used in file names and tables)."""
        return "eca" if self.elementary else f"k{self.k}r{self.r}"

    def describe(self) -> str:
        if self.elementary:
            return "elementary CA, Wolfram numbering"
        return f"k = {self.k} colours, radius r = {self.r} (rules 0..{self.k}^{self.neighbourhoods} - 1)"

    def as_dict(self) -> dict:
        return {"k": self.k, "r": self.r}

    # --- validation ------------------------------------------------------------------------------
    def check_rule(self, rule) -> int:
        """The rule as a Python int; the error names the family and the allowed range."""
        if isinstance(rule, (bool, np.bool_)) or not isinstance(rule, (int, np.integer)):
            family = "" if self.elementary else f" ({self.describe()})"
            raise ValueError(f"rule must be an integer in 0..{self._max_rule_text()}{family}, got {rule!r}")
        if not 0 <= int(rule) < self.num_rules:
            raise ValueError(f"rule must be in 0..{self._max_rule_text()} ({self.describe()}), got {rule}")
        return int(rule)

    def check_rules(self, rules) -> list[int]:
        if isinstance(rules, str):
            raise ValueError(f"rules must be a collection of integers in 0..{self._max_rule_text()}, got the "
                             f"string {rules!r} (parse_rule_list turns '0-255' or '30,110' into a list)")
        if hasattr(rules, "tolist"):   # numpy arrays and torch tensors
            rules = rules.tolist()
        if not hasattr(rules, "__iter__"):
            raise ValueError(f"rules must be a collection of integers in 0..{self._max_rule_text()} "
                             f"(e.g. [30, 110]), got {rules!r}")
        rules = [self.check_rule(r) for r in rules]
        if not rules:
            raise ValueError(f"rule set must contain at least one rule in 0..{self._max_rule_text()}, "
                             f"got an empty set")
        return rules

    def check_cells(self, cells, what: str = "tape") -> np.ndarray:
        """Cells as uint8 in 0..k-1; the error lists the values outside."""
        arr = np.asarray(cells)
        if arr.dtype.kind not in "biuf" or not np.all((arr >= 0) & (arr < self.k) & (arr == np.floor(arr))):
            bad = sorted(set(np.unique(arr).tolist()) - set(range(self.k)))
            raise ValueError(f"{what} cells must be integers in 0..{self.k - 1}, got values {bad}")
        return arr.astype(np.uint8)

    def _max_rule_text(self) -> str:
        return "255" if self.elementary else f"{self.k}^{self.neighbourhoods} - 1"

    # --- numbering -------------------------------------------------------------------------------
    def table(self, rule) -> np.ndarray:
        """The rule table F as uint8 of length k^(2r+1): table[idx] = digit idx of N in base k."""
        n = self.check_rule(rule)
        out = np.empty(self.neighbourhoods, dtype=np.uint8)
        for idx in range(self.neighbourhoods):
            n, out[idx] = divmod(n, self.k)
        return out

    def tables(self, rules) -> np.ndarray:
        """(n, k^(2r+1)) uint8 tables of a rule list."""
        rules = self.check_rules(rules)
        return np.stack([self.table(rule) for rule in rules])

    def number(self, table) -> int:
        """The rule number of a table (inverse of `table`)."""
        table = np.asarray(table)
        if table.shape != (self.neighbourhoods,):
            raise ValueError(f"a rule table of {self.describe()} has {self.neighbourhoods} entries, "
                             f"got shape {table.shape}")
        table = self.check_cells(table, what="rule table")
        n = 0
        for value in table[::-1]:
            n = n * self.k + int(value)
        return n

    def neighbourhood(self, idx: int) -> tuple[int, ...]:
        """The cells (x[i-r], ..., x[i+r]) of neighbourhood index idx."""
        cells = []
        for _ in range(self.width):
            idx, digit = divmod(idx, self.k)
            cells.append(digit)
        return tuple(reversed(cells))

    def index(self, cells) -> int:
        """The neighbourhood index of (x[i-r], ..., x[i+r])."""
        idx = 0
        for cell in cells:
            idx = idx * self.k + int(cell)
        return idx

    @cached_property
    def place_values(self) -> np.ndarray:
        """k^(r-j) for j = -r..r: idx = cells @ place_values."""
        return np.array([self.k ** (self.width - 1 - j) for j in range(self.width)], dtype=np.int64)

    # --- mirror equivalence ----------------------------------------------------------------------
    @cached_property
    def mirror_permutation(self) -> np.ndarray:
        """perm[idx] = index of the reflected neighbourhood; mirror table = table[perm]."""
        return np.array([self.index(reversed(self.neighbourhood(idx))) for idx in range(self.neighbourhoods)],
                        dtype=np.int64)

    def mirror_rule(self, rule) -> int:
        """The rule that acts on reflected tapes like `rule` on the originals (left and right swapped)."""
        return self.number(self.table(rule)[self.mirror_permutation])

    def is_self_mirror(self, rule) -> bool:
        return self.mirror_rule(rule) == self.check_rule(rule)

    def class_representative(self, rule) -> int:
        return min(self.check_rule(rule), self.mirror_rule(rule))

    # --- descriptors used to sample and compare rules -------------------------------------------
    def langton_lambda(self, rule) -> float:
        """Fraction of neighbourhoods that do not map to the quiescent state 0 (Langton's lambda)."""
        return float(np.mean(self.table(rule) != QUIESCENT_STATE))

    @cached_property
    def neighbourhood_sums(self) -> np.ndarray:
        return np.array([sum(self.neighbourhood(idx)) for idx in range(self.neighbourhoods)], dtype=np.int64)

    @cached_property
    def centre_cells(self) -> np.ndarray:
        return np.array([self.neighbourhood(idx)[self.r] for idx in range(self.neighbourhoods)], dtype=np.int64)

    def is_totalistic(self, rule) -> bool:
        """F depends only on the sum of the neighbourhood."""
        return _depends_only_on(self.table(rule), self.neighbourhood_sums)

    def is_outer_totalistic(self, rule) -> bool:
        """F depends only on the centre cell and the sum of the other cells."""
        key = self.centre_cells * (self.width * (self.k - 1) + 1) + (self.neighbourhood_sums - self.centre_cells)
        return _depends_only_on(self.table(rule), key)

    def hamming(self, rule_a, rule_b) -> int:
        """Rule-table Hamming distance: neighbourhoods on which the two rules differ."""
        return int(np.count_nonzero(self.table(rule_a) != self.table(rule_b)))


def _depends_only_on(table: np.ndarray, key: np.ndarray) -> bool:
    seen: dict[int, int] = {}
    for value, group in zip(table.tolist(), key.tolist()):
        if seen.setdefault(group, value) != value:
            return False
    return True


ELEMENTARY = RuleFamily(2, 1)


def family_from_config(section: dict | None) -> RuleFamily | GridFamily:
    """The family of a config section {k, r} (missing keys: the elementary values); an artifact's
    {neighbourhood: moore | von_neumann} is a 2D grid family (`grid_rules.GridFamily`)."""
    section = section or {}
    if "neighbourhood" in section:
        if set(section) != {"neighbourhood"}:
            raise ValueError(f"a grid family has the one key neighbourhood, got keys {sorted(section)}")
        return GridFamily(section["neighbourhood"])
    unknown = sorted(set(section) - {"k", "r"})
    if unknown:
        raise ValueError(f"rule family accepts the keys k and r (or neighbourhood for a 2D grid family), got "
                         f"unknown keys {unknown}")
    return RuleFamily(section.get("k", ELEMENTARY.k), section.get("r", ELEMENTARY.r))


def family_from_name(name: str) -> RuleFamily:
    """The family of a `RuleFamily.name` ('eca', or 'k{k}r{r}' such as 'k3r1')."""
    if name == ELEMENTARY.name:
        return ELEMENTARY
    match = re.fullmatch(r"k(\d)r(\d)", str(name))
    if match is None:
        raise ValueError(f"a rule family name is 'eca' or 'k<colours>r<radius>' (e.g. 'k3r1'), got {name!r}")
    return RuleFamily(int(match.group(1)), int(match.group(2)))


def config_family(config: dict) -> RuleFamily:
    """The rule family of a pipeline config (elementary unless rule_set.family says otherwise)."""
    return family_from_config(config.get("rule_set", {}).get("family"))


def family_phrase(family, L: int) -> str | None:
    """How a caption names the rules it reports on (plain text): None for the elementary family (the default, named
    by nothing); the 2D grid family with its torus, e.g. 'outer-totalistic Moore rules on an 8 × 8 torus' (L = n * n
    cells); another tape family by its description. Table 3, the per-type table and the report's captions use it."""
    if family is None or family.elementary:
        return None
    if not isinstance(family, GridFamily):
        return family.describe()
    n = math.isqrt(int(L))
    if n * n != int(L):
        raise ValueError(f"a grid of L = {L} cells is not square; a grid of side n has L = n * n cells")
    article = "an" if n in (8, 11, 18) or 80 <= n < 90 else "a"
    return f"outer-totalistic {family.name_in_text} rules on {article} {n} × {n} torus"
