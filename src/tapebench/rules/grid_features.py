"""The rule space of the 2D grid family (docs/protocol.md#grid-rule-space): per-rule features, growth classes,
cycles on the torus, operational types, the complement map and seeded samples of the Moore family.

Static features (from B and S alone; m neighbours):
  lambda        Langton's λ: the fraction of the 2^(m+1) neighbourhood configurations (centre cell and its m
                neighbours) mapped to 1, i.e. the table entries T[state, count] weighted by C(m, count) / 2^(m+1),
                the probability of (state, count) under Bernoulli(0.5) cells. It is λ of the rule's full
                (non-totalistic) table, so it is comparable with λ of the tape families.
  lambda_table  the unweighted fraction of the 2(m+1) entries T[state, count] equal to 1 (descriptive only).
  b0            0 ∈ B: a dead cell with no live neighbour is born, so the all-zero grid becomes all ones.
  fertile       1 ∈ B or 2 ∈ B: a single live cell or a pair seeds births around it (sparse grids grow).
  mortal        S = ∅: every live cell dies in one update.
  sterile       B = ∅: no cell is ever born, so the live count never rises (without actions).

Dynamic features: `trials` random n × n grids (i.i.d. Bernoulli(0.5), drawn with `seed`, n = 8 so the packed
kernel runs them) evolve freely for `steps` updates; statistics over x_1..x_T averaged over time and rollouts,
exactly as for tapes (`rules/features.py`): density, density_std, activity, activity_2step, entropy (binary
entropy of a grid's density). The type is the tapes' `rule_type(activity, entropy)` with the paper's
thresholds unchanged (a transfer to 2D, not a calibration): stable / periodic / chaotic.

Cycles: from the same start grids, the transient μ and period λ of the free evolution (`grid_packed.cycle_words`),
found when μ + λ ≤ `max_steps`. Each rollout ends `extinct` (in the all-zero grid), `fixed` (a non-zero fixed
point), `periodic` (period ≥ 2) or `long` (no repeat within max_steps). Columns: the fraction of rollouts of each
outcome, the rule's `attractor` (the most frequent outcome; ties go to the earlier one in ATTRACTORS), the
median transient and the largest period over resolved rollouts (-1 / 0 when none resolved).

Symmetries (docs/protocol.md#grid-rule-space): outer-totalistic rules are isotropic and translation invariant,
so the grid's rotations, reflections and shifts map every rule to itself; there is no rule-to-rule
identification like the tapes' mirror (each rule is its own class: `mirror_rule` = `mirror_class` = `rule`).
The complement (swap 0 and 1) maps a rule to `complement_rule` but moves the all-zero goal to all ones, so it
is not an equivalence of tasks.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.ca.grid_packed import MAX_PACKED, cycle_words, pack, step_words_rules
from tapebench.grid_rules import MOORE, GridFamily, GridRule
from tapebench.rules.features import MAX_STEPS, MAX_TRIALS, binary_entropy, rule_type
from tapebench.rules.sampling import MAX_SAMPLE, bin_text, lambda_edges
from tapebench.schemas import GRID_FEATURE_COLUMNS
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import check_integer

GRID_FEATURE_NAMES = ("density", "density_std", "activity", "activity_2step", "entropy", "lambda")
ATTRACTORS = ("extinct", "fixed", "periodic", "long")
GROWTH_FLAGS = ("b0", "fertile", "mortal", "sterile")
DEFAULT_MAX_CYCLE_STEPS = 256
CHUNK = 256   # rules simulated at once (64 trials x 65 steps x 256 rules of uint64: 8.5 MB)


@dataclass(frozen=True)
class GridFeatureProtocol:
    """How the rollouts behind the grid features are simulated."""

    n: int = MAX_PACKED
    """grid side (3..8: one packed word per grid)"""
    trials: int = defaults.FEATURE_TRIALS
    """random start grids per rule"""
    steps: int = defaults.FEATURE_STEPS
    """updates behind the statistics (no burn-in)"""
    max_cycle_steps: int = DEFAULT_MAX_CYCLE_STEPS
    """a cycle counts when transient + period ≤ this"""
    seed: int = defaults.FEATURE_SEED
    """seed of the start grids (common to all rules)"""

    def __post_init__(self):
        check_integer(self.n, "grid features n (one 64-bit word per grid)", 3, MAX_PACKED)
        check_integer(self.trials, "trials", minimum=1, maximum=MAX_TRIALS)
        check_integer(self.steps, "steps", minimum=2, maximum=MAX_STEPS)
        check_integer(self.max_cycle_steps, "max_cycle_steps", minimum=1, maximum=1 << 16)
        check_integer(self.seed, "seed", minimum=0)

    def as_dict(self) -> dict:
        return {k: int(v) for k, v in asdict(self).items()}


def langton_lambda(rule: GridRule) -> float:
    """Fraction of the 2^(m+1) neighbourhood configurations the rule maps to 1 (exact: a dyadic rational)."""
    m = rule.family.neighbours
    ones = sum(comb(m, c) for c in rule.birth) + sum(comb(m, c) for c in rule.survival)
    return ones / 2 ** (m + 1)


def table_lambda(rule: GridRule) -> float:
    """Fraction of the 2(m+1) table entries T[state, count] equal to 1."""
    return (len(rule.birth) + len(rule.survival)) / (2 * rule.family.counts)


def growth_flags(rule: GridRule) -> dict[str, bool]:
    """b0, fertile, mortal, sterile (module docstring)."""
    return {"b0": 0 in rule.birth, "fertile": bool({1, 2} & rule.birth), "mortal": not rule.survival,
            "sterile": not rule.birth}


def complement_rule(rule: GridRule) -> GridRule:
    """The rule R' with complement(R(x)) = R'(complement(x)): B' = {m − s : s ∉ S}, S' = {m − b : b ∉ B}.
    An involution; it maps the all-zero goal to the all-ones grid, so R and R' are different tasks."""
    m = rule.family.neighbours
    counts = range(m + 1)
    return GridRule(rule.family, frozenset(m - s for s in counts if s not in rule.survival),
                    frozenset(m - b for b in counts if b not in rule.birth))


def start_grids(protocol: GridFeatureProtocol) -> np.ndarray:
    """(trials, n, n) uint8 i.i.d. Bernoulli(0.5) grids of the protocol's seed."""
    rng = np.random.default_rng(protocol.seed)
    return rng.integers(0, 2, size=(protocol.trials, protocol.n, protocol.n), dtype=np.uint8)


def _dynamics(family: GridFamily, ids: np.ndarray, protocol: GridFeatureProtocol) -> dict[str, np.ndarray]:
    """The dynamic columns of `ids` (in chunks of CHUNK rules, so memory stays bounded)."""
    if len(ids) > CHUNK:
        parts = [_dynamics(family, ids[i:i + CHUNK], protocol) for i in range(0, len(ids), CHUNK)]
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    n, T = protocol.n, protocol.steps
    cells = n * n
    starts = pack(start_grids(protocol))
    rollouts = len(starts)
    initial = np.tile(starts, len(ids))
    rule_of_row = np.repeat(ids, rollouts)
    moore = family == MOORE
    words = np.empty((T + 1, initial.size), dtype=np.uint64)
    words[0] = state = initial
    for t in range(T):
        state = step_words_rules(state, rule_of_row, n, moore)
        words[t + 1] = state
    words = words.reshape(T + 1, len(ids), rollouts)
    ones = np.bitwise_count(words[1:]).astype(np.int64)                       # (T, R, rollouts)
    changes = np.bitwise_count(words[1:] ^ words[:-1]).astype(np.int64)
    changes_2step = np.bitwise_count(words[2:] ^ words[:-2]).astype(np.int64)
    out = {
        "density": ones.sum(axis=(0, 2)) / (T * rollouts * cells),
        "density_std": (ones / cells).std(axis=0).mean(axis=1),
        "activity": changes.sum(axis=(0, 2)) / (T * rollouts * cells),
        "activity_2step": changes_2step.sum(axis=(0, 2)) / ((T - 1) * rollouts * cells),
        "entropy": binary_entropy(ones / cells).mean(axis=(0, 2)),
    }
    transient, period, entry = (a.reshape(len(ids), rollouts) for a in cycle_words(
        initial, rule_of_row, n, moore, protocol.max_cycle_steps))
    resolved = period > 0
    outcome = np.select([~resolved, period >= 2, entry != 0], [3, 2, 1], default=0)   # 0: the all-zero point
    for i, name in enumerate(ATTRACTORS):
        out[f"{name}_fraction"] = (outcome == i).mean(axis=1)
    counts = np.stack([(outcome == i).sum(axis=1) for i in range(len(ATTRACTORS))], axis=1)
    out["attractor"] = np.asarray(ATTRACTORS)[counts.argmax(axis=1)]       # argmax: first of the tied
    out["median_transient"] = np.array([np.median(row[ok]) if ok.any() else -1.0
                                        for row, ok in zip(transient, resolved)])
    out["max_period"] = period.max(axis=1)
    return out


def grid_rule_features(family: GridFamily, rules=None, protocol: GridFeatureProtocol | None = None) -> pd.DataFrame:
    """One row per rule (sorted by id), columns GRID_FEATURE_COLUMNS. `rules` defaults to the whole family,
    allowed only for von Neumann (1,024 rules); a Moore table needs a list (`sample_grid_rules`)."""
    protocol = protocol or GridFeatureProtocol()
    if rules is None:
        if family == MOORE:
            raise ValueError(f"features of the {family.describe()} need an explicit rule list (a sample, "
                             f"`sample_grid_rules`): the family has {family.num_rules} rules")
        rules = range(family.num_rules)
    parsed = sorted({r.id: r for r in family.rules(rules)}.values(), key=lambda r: r.id)
    ids = np.asarray([r.id for r in parsed], dtype=np.int64)
    dyn = _dynamics(family, ids, protocol)
    flags = [growth_flags(r) for r in parsed]
    frame = pd.DataFrame({
        "rule": ids, "notation": [str(r) for r in parsed], "mirror_rule": ids, "mirror_class": ids,
        "type": [rule_type(a, e) for a, e in zip(dyn["activity"], dyn["entropy"])],
        **{name: dyn[name] for name in GRID_FEATURE_NAMES if name != "lambda"},
        "lambda": [langton_lambda(r) for r in parsed], "lambda_table": [table_lambda(r) for r in parsed],
        **{flag: [f[flag] for f in flags] for flag in GROWTH_FLAGS},
        **{f"{a}_fraction": dyn[f"{a}_fraction"] for a in ATTRACTORS},
        "attractor": dyn["attractor"], "median_transient": dyn["median_transient"],
        "max_period": dyn["max_period"].astype(np.int64),
        "complement_rule": np.asarray([complement_rule(r).id for r in parsed], dtype=np.int64),
    })
    return frame[list(GRID_FEATURE_COLUMNS)]


def all_lambdas(family: GridFamily) -> np.ndarray:
    """Langton's λ of every id of the family, vectorised (index = id)."""
    m, counts = family.neighbours, family.counts
    weights = np.array([comb(m, c) for c in range(counts)] * 2, dtype=np.int64)
    ids = np.arange(family.num_rules, dtype=np.int64)
    bits = (ids[:, None] >> np.arange(2 * counts)) & 1
    return (bits @ weights) / 2 ** (m + 1)


def sample_grid_rules(family: GridFamily, n: int, lambda_bins=5, seed: int = 0, allow_b0: bool = True) -> dict:
    """A seeded sample of `n` rules stratified by Langton's λ: equal shares per bin (the remainder to the lowest
    bins, as `rules/sampling.py`), each bin's rules drawn uniformly without replacement among all the family's
    ids in it (enumerated: exact, no rejection). `allow_b0=False` leaves out the B0 rules. Deterministic per seed."""
    check_integer(n, "grid rule sample n", minimum=1, maximum=min(MAX_SAMPLE, family.num_rules))
    check_integer(seed, "seed", minimum=0)
    edges = lambda_edges(lambda_bins)
    lam = all_lambdas(family)
    ids = np.arange(family.num_rules, dtype=np.int64)
    keep = np.ones(len(ids), dtype=bool) if allow_b0 else (ids & 1) == 0
    bins = len(edges) - 1
    wanted = [n // bins + (1 if i < n % bins else 0) for i in range(bins)]
    rng = np.random.default_rng(seed)
    picked, per_rule = [], []
    for b in range(bins):
        lo, hi = edges[b], edges[b + 1]
        inside = keep & (lam >= lo) & ((lam < hi) | ((b == bins - 1) & (lam == hi)))
        pool = ids[inside]
        if len(pool) < wanted[b]:
            raise ValueError(f"lambda bin {b} {bin_text(edges, b)} holds {len(pool)} rules of the "
                             f"{family.describe()}, {wanted[b]} requested; use a smaller n or fewer bins")
        chosen = np.sort(rng.choice(pool, size=wanted[b], replace=False))
        picked.extend(int(r) for r in chosen)
        per_rule.extend({"rule": int(r), "lambda": float(lam[r]), "bin": b} for r in chosen)
    per_rule.sort(key=lambda row: row["rule"])
    return {"family": family.name, "sample": {"n": int(n), "lambda_bins": lambda_bins, "seed": int(seed),
                                               "allow_b0": bool(allow_b0)},
            "lambda_edges": list(edges), "rules": sorted(picked), "per_rule": per_rule}


def write_grid_features(path, family: GridFamily, rules=None, protocol: GridFeatureProtocol | None = None,
                        sample: dict | None = None) -> pd.DataFrame:
    """The feature table as Parquet (atomic), its protocol, family and sample recorded in the metadata."""
    protocol = protocol or GridFeatureProtocol()
    frame = grid_rule_features(family, rules, protocol)
    config = {"family": family.as_dict(), "protocol": protocol.as_dict(), "feature_names": list(GRID_FEATURE_NAMES)}
    if sample is not None:
        config["sample"] = sample
    write_parquet(path, frame, meta=provenance(config, seed=protocol.seed))
    return frame
