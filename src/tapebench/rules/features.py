"""Rule features and operational types (docs/protocol.md#rule-types; paper App. E.2).

Protocol: `trials` random tapes (i.i.d. Bernoulli(0.5) cells, length L, drawn with `seed`) plus
their reflections evolve freely (no actions) for `steps` CA updates under every rule. Statistics
are taken over the `steps` updated tapes x_1..x_T (the random start x_0 is not a product of the
rule), averaged over time and rollouts, with no burn-in. The reflected copies make every
feature exactly equal for a rule and its mirror (mirror rules are the same task, docs/protocol.md#mirror-classes).

Feature columns (FEATURE_NAMES, all in [0, 1]):
  density         mean fraction of ones
  density_std     standard deviation over time of a tape's density, averaged over rollouts
  activity        `act`: mean fraction of cells that change in one CA step (x_{t-1} -> x_t)
  activity_2step  mean fraction of cells that differ from two steps earlier (0 for period-2 blinkers)
  entropy         `ent`: mean binary entropy H2(density of x_t) in bits, the Bernoulli marginal
  block_entropy   Shannon entropy of the pooled 3-cell block distribution, bits per cell (/3)

Type (the paper's thresholds): stable if act < 0.06 and ent < 0.25; chaotic if act > 0.22 and
ent > 0.55; periodic otherwise.

Protocol choices (defaults L=32, 64 trials, 64 steps, seed 0, no burn-in). The types are computed,
never hand-set; the paper's anchors (0 stable; 4, 108, 204, 90 periodic; 30, 110 chaotic) hold.
Rule 90 is the sensitive one: on a ring of L = 2^k cells it is nilpotent (every tape is all zeros
after L/2 steps), so averaged from t=1 over 64 steps at L=32 it has act 0.12 / ent 0.22 (periodic).
A burn-in of >= 16 steps makes it stable; an odd L (31) makes it chaotic (act 0.50 / ent 0.98);
L=64 keeps it periodic only narrowly (ent 0.46 < 0.55). Type counts at the defaults:
24 stable, 63 periodic, 169 chaotic.

Families with k > 2 colours (docs/protocol.md#rule-sets): start tapes are uniform over the k colours;
density and density_std count non-zero cells (the goal is all-zero), activity and activity_2step count
changed cells, entropy is the entropy of a tape's colour histogram and block_entropy that of the pooled
3-cell blocks, both divided by log2 k (and by 3) so that they stay in [0, 1] and the thresholds keep
their scale. For k > 2 the thresholds are therefore a transfer of the paper's, not the paper's.
The elementary family keeps its bit-packed code path (byte-identical artifacts).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.ca.packed import pack, step_words_rules
from tapebench.ca.reference import ca_step
from tapebench.rule_family import ELEMENTARY, RuleFamily, family_from_config
from tapebench.rules.mirror import class_representative, mirror_rule, reflect_tape
from tapebench.utils.artifacts import CorruptArtifact, expect_parquet
from tapebench.utils.io import provenance, read_parquet_meta, write_parquet
from tapebench.validation import check_integer, check_length, check_rules
from tapebench.vocabulary import GOAL_MODES, ZEROS_GOAL

FEATURE_NAMES = ("density", "density_std", "activity", "activity_2step", "entropy", "block_entropy")
RULE_TYPES = ("stable", "periodic", "chaotic")
STABLE_MAX_ACTIVITY, STABLE_MAX_ENTROPY = 0.06, 0.25
CHAOTIC_MIN_ACTIVITY, CHAOTIC_MIN_ENTROPY = 0.22, 0.55
MAX_TRIALS, MAX_STEPS = 4096, 4096


@dataclass(frozen=True)
class FeatureProtocol:
    """How the rollouts behind the features are simulated."""

    L: int = defaults.L
    """tape length (the benchmark's default L, so features describe the dynamics agents face)"""
    trials: int = defaults.FEATURE_TRIALS
    """random start tapes per rule; each is also run reflected, so 2*trials rollouts"""
    steps: int = defaults.FEATURE_STEPS
    """CA updates per rollout; statistics cover all of them (no burn-in)"""
    seed: int = defaults.FEATURE_SEED
    """seed of the start tapes (common to all rules)"""

    def __post_init__(self):
        check_length(self.L)
        check_integer(self.trials, "trials", minimum=1, maximum=MAX_TRIALS)
        check_integer(self.steps, "steps", minimum=1, maximum=MAX_STEPS)
        if self.steps < 2:
            raise ValueError(f"steps must be >= 2 (activity_2step compares x_t with x_(t-2)), got {self.steps}")
        check_integer(self.seed, "seed", minimum=0)

    def as_dict(self) -> dict:
        return {k: int(v) for k, v in asdict(self).items()}


def solved_by_any_action(rule: int, family: RuleFamily = ELEMENTARY, goal: str = ZEROS_GOAL) -> bool:
    """Whether every action reaches the goal in one step from every tape. With the all-zero goal (`goal` "zeros"):
    the rule maps every neighbourhood to 0 (only rule 0, in every family). With derived goals ("derived",
    docs/protocol.md#multi-goal): the rule maps every neighbourhood to one colour c, so every tape it reaches is
    c...c and that is the episode's goal (elementary: rules 0 and 255). Such a test rule is solved without any
    inference or control, so tables report how many test rules are of this kind."""
    if goal not in GOAL_MODES:
        raise ValueError(f"goal must be one of {list(GOAL_MODES)}, got {goal!r}")
    if not family.elementary:
        outputs = np.unique(family.table(rule))
    else:
        z = check_rules([rule])[0]
        outputs = np.unique([ca_step(np.array(bits, dtype=np.uint8), z)[1] for bits in
                             ((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1))])
    if goal == ZEROS_GOAL:
        return outputs.tolist() == [0]
    return len(outputs) == 1


def rule_type(activity: float, entropy: float) -> str:
    if activity < STABLE_MAX_ACTIVITY and entropy < STABLE_MAX_ENTROPY:
        return "stable"
    if activity > CHAOTIC_MIN_ACTIVITY and entropy > CHAOTIC_MIN_ENTROPY:
        return "chaotic"
    return "periodic"


def start_tapes(protocol: FeatureProtocol, family: RuleFamily = ELEMENTARY) -> np.ndarray:
    """(2*trials, L) uint8: the random tapes (uniform over the family's colours) followed by their reflections."""
    rng = np.random.default_rng(protocol.seed)
    tapes = rng.integers(0, family.k, size=(protocol.trials, protocol.L), dtype=np.uint8)
    return np.concatenate([tapes, reflect_tape(tapes)])


def rollout_words(rules, protocol: FeatureProtocol) -> np.ndarray:
    """Packed free evolution: (steps + 1, len(rules), 2*trials) uint64 words, x_0 first."""
    rules = np.asarray(check_rules(rules), dtype=np.int64)
    starts = pack(start_tapes(protocol))
    state = np.tile(starts, len(rules))
    rule_of_row = np.repeat(rules, len(starts))
    trajectory = np.empty((protocol.steps + 1, state.size), dtype=np.uint64)
    trajectory[0] = state
    for t in range(protocol.steps):
        state = step_words_rules(state, rule_of_row, protocol.L)
        trajectory[t + 1] = state
    return trajectory.reshape(protocol.steps + 1, len(rules), len(starts))


def binary_entropy(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    out = np.zeros_like(p)
    inside = (p > 0) & (p < 1)
    q = p[inside]
    out[inside] = -(q * np.log2(q) + (1 - q) * np.log2(1 - q))
    return out


def _block_counts(words: np.ndarray, L: int) -> np.ndarray:
    """Counts of the 8 neighbourhood patterns (index 4l+2c+r) per rule, pooled over time and rollouts."""
    one, mask = np.uint64(1), np.uint64((1 << L) - 1)
    left = ((words << one) | (words >> np.uint64(L - 1))) & mask
    right = ((words >> one) | (words << np.uint64(L - 1))) & mask
    counts = np.empty((words.shape[1], 8), dtype=np.int64)
    for idx in range(8):
        hit = mask
        for bits, bit_on in ((left, idx & 4), (words, idx & 2), (right, idx & 1)):
            hit = hit & (bits if bit_on else ~bits)
        counts[:, idx] = np.bitwise_count(hit).sum(axis=(0, 2), dtype=np.int64)
    return counts


def rule_statistics(rules, protocol: FeatureProtocol) -> np.ndarray:
    """(len(rules), len(FEATURE_NAMES)) float64 features, columns in FEATURE_NAMES order.

    Every reduction is order-independent over rollouts (integer sums, histograms, sorted values),
    so a rule and its mirror get bit-identical features from the reflection-closed start set.
    """
    L, T = protocol.L, protocol.steps
    words = rollout_words(rules, protocol)
    rollouts = words.shape[2]
    ones = np.bitwise_count(words[1:]).astype(np.int64)                    # (T, R, n)
    changes = np.bitwise_count(words[1:] ^ words[:-1]).astype(np.int64)
    changes_2step = np.bitwise_count(words[2:] ^ words[:-2]).astype(np.int64)

    density = ones.sum(axis=(0, 2)) / (T * rollouts * L)
    activity = changes.sum(axis=(0, 2)) / (T * rollouts * L)
    activity_2step = changes_2step.sum(axis=(0, 2)) / ((T - 1) * rollouts * L)
    entropy_of_count = binary_entropy(np.arange(L + 1) / L)
    count_hist = np.stack([np.bincount(ones[:, r].ravel(), minlength=L + 1) for r in range(ones.shape[1])])
    entropy = count_hist @ entropy_of_count / (T * rollouts)
    density_std = np.sort((ones / L).std(axis=0), axis=1).mean(axis=1)      # std over time per rollout
    block_p = np.sort(_block_counts(words[1:], L) / (T * rollouts * L), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        block_entropy = np.where(block_p > 0, -block_p * np.log2(block_p), 0.0).sum(axis=1) / 3
    return np.stack([density, density_std, activity, activity_2step, entropy, block_entropy], axis=1)


def family_step(state: np.ndarray, tables: np.ndarray, family: RuleFamily) -> np.ndarray:
    """One CA update of a batch: state (N, L) uint8, tables (N, k^(2r+1)) uint8 (the rule of each row)."""
    idx = np.zeros(state.shape, dtype=np.int64)
    for j, place in zip(range(-family.r, family.r + 1), family.place_values):
        idx += np.roll(state, -j, axis=1).astype(np.int64) * int(place)     # x[i+j]
    return np.take_along_axis(tables, idx, axis=1)


def family_rollouts(rules, protocol: FeatureProtocol, family: RuleFamily) -> np.ndarray:
    """Free evolution of the start tapes: (steps + 1, len(rules), 2*trials, L) uint8, x_0 first."""
    starts = start_tapes(protocol, family)
    tables = np.repeat(family.tables(rules), len(starts), axis=0)
    state = np.tile(starts, (len(rules), 1))
    trajectory = np.empty((protocol.steps + 1, *state.shape), dtype=np.uint8)
    trajectory[0] = state
    for t in range(protocol.steps):
        state = family_step(state, tables, family)
        trajectory[t + 1] = state
    return trajectory.reshape(protocol.steps + 1, len(rules), len(starts), protocol.L)


def _entropy_bits(counts: np.ndarray, total: int) -> np.ndarray:
    """Shannon entropy (bits) of count vectors along the last axis."""
    p = counts / total
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, -p * np.log2(p), 0.0).sum(axis=-1)


def family_statistics(rules, protocol: FeatureProtocol, family: RuleFamily, chunk: int = 64) -> np.ndarray:
    """Like `rule_statistics` for a family with k colours (module docstring); entropies / log2 k.

    Per-tape values are reduced in sorted order, so a rule and its mirror get bit-identical features."""
    rules = family.check_rules(rules)
    if len(rules) > chunk:
        return np.concatenate([family_statistics(rules[i:i + chunk], protocol, family, chunk)
                               for i in range(0, len(rules), chunk)])
    L, T, k = protocol.L, protocol.steps, family.k
    x = family_rollouts(rules, protocol, family)                           # (T+1, R, n, L)
    rollouts = x.shape[2]
    nonzero = np.count_nonzero(x[1:], axis=3).astype(np.int64)           # (T, R, n)
    changes = np.count_nonzero(x[1:] != x[:-1], axis=3).sum(axis=(0, 2))
    changes_2step = np.count_nonzero(x[2:] != x[:-2], axis=3).sum(axis=(0, 2))
    density = nonzero.sum(axis=(0, 2)) / (T * rollouts * L)
    activity = changes / (T * rollouts * L)
    activity_2step = changes_2step / ((T - 1) * rollouts * L)
    colour_counts = np.stack([np.count_nonzero(x[1:] == c, axis=3) for c in range(k)], axis=-1)
    tape_entropy = _entropy_bits(colour_counts, L) / np.log2(k)           # (T, R, n)
    entropy = np.sort(tape_entropy.transpose(1, 0, 2).reshape(len(rules), -1), axis=1).mean(axis=1)
    density_std = np.sort((nonzero / L).std(axis=0), axis=1).mean(axis=1)
    blocks = (x[1:].astype(np.int64) * k * k + np.roll(x[1:], -1, axis=3) * k + np.roll(x[1:], -2, axis=3))
    block_counts = np.stack([np.bincount(blocks[:, r].ravel(), minlength=k ** 3) for r in range(len(rules))])
    block_entropy = _entropy_bits(np.sort(block_counts, axis=1), T * rollouts * L) / (3 * np.log2(k))
    return np.stack([density, density_std, activity, activity_2step, entropy, block_entropy], axis=1)


def rule_features(rules=None, protocol: FeatureProtocol | None = None,
                  family: RuleFamily = ELEMENTARY) -> pd.DataFrame:
    """One row per rule: rule, mirror_rule, mirror_class, type, then FEATURE_NAMES columns."""
    protocol = protocol or FeatureProtocol()
    if family.elementary:
        rules = sorted(set(check_rules(range(256) if rules is None else rules)))
        stats = rule_statistics(rules, protocol)
    else:
        if rules is None:
            raise ValueError(f"features of {family.describe()} need an explicit rule list (a sampled rule set, "
                             f"`tapebench rule-set`): the family has {family.num_rules} rules")
        rules = sorted(set(family.check_rules(rules)))
        stats = family_statistics(rules, protocol, family)
    frame = pd.DataFrame(stats, columns=list(FEATURE_NAMES))
    frame.insert(0, "rule", np.asarray(rules, dtype=np.int64))
    frame.insert(1, "mirror_rule", np.asarray([mirror_rule(r, family) for r in rules], dtype=np.int64))
    frame.insert(2, "mirror_class", np.asarray([class_representative(r, family) for r in rules], dtype=np.int64))
    frame.insert(3, "type", [rule_type(a, e) for a, e in zip(frame["activity"], frame["entropy"])])
    return frame


def features_config(protocol: FeatureProtocol, family: RuleFamily = ELEMENTARY, rule_set: dict | None = None) -> dict:
    """The config slice recorded with the features artifact (the family only when it is not elementary, the
    sample's parameters when the rules are a sampled rule set)."""
    out = {"protocol": protocol.as_dict(), "feature_names": list(FEATURE_NAMES),
           "thresholds": {"stable": {"activity_below": STABLE_MAX_ACTIVITY, "entropy_below": STABLE_MAX_ENTROPY},
                          "chaotic": {"activity_above": CHAOTIC_MIN_ACTIVITY,
                                      "entropy_above": CHAOTIC_MIN_ENTROPY}}}
    if not family.elementary:
        out["family"] = family.as_dict()
    if rule_set is not None:
        out["rule_set"] = rule_set
    return out


def features_family(meta: dict) -> RuleFamily:
    """The family a features artifact describes (elementary when its metadata names none)."""
    return family_from_config(meta.get("config", {}).get("family"))


def write_features(path, protocol: FeatureProtocol | None = None, rules=None,
                   family: RuleFamily = ELEMENTARY, rule_set: dict | None = None) -> pd.DataFrame:

    protocol = protocol or FeatureProtocol()
    if not family.fits_int64:
        raise ValueError(f"features store rule numbers as int64; {family.describe()} has rules beyond 64 bits")
    frame = rule_features(rules, protocol, family)
    write_parquet(path, frame, meta=provenance(features_config(protocol, family, rule_set), seed=protocol.seed))
    return frame


def read_features(path) -> tuple[pd.DataFrame, dict]:
    """Load a features artifact and check it has what splits need; returns (frame, metadata)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"features file not found: {path} (create it with `tapebench features --out {path}`)")
    expect_parquet(path, "a rule-features table", "tapebench features")
    try:
        frame = pd.read_parquet(path)
        meta = read_parquet_meta(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {exc}", "tapebench features") from None
    feature_names = meta.get("config", {}).get("feature_names", list(FEATURE_NAMES))
    missing = [c for c in ("rule", "type", *feature_names) if c not in frame.columns]
    if missing:
        raise ValueError(f"features file {path} is missing columns {missing}")
    if frame["rule"].duplicated().any():
        dup = sorted(frame.loc[frame["rule"].duplicated(), "rule"].tolist())
        raise ValueError(f"features file {path} lists rules more than once: {dup}")
    features_family(meta).check_rules(frame["rule"].tolist())
    bad_types = sorted(set(frame["type"]) - set(RULE_TYPES))
    if bad_types:
        raise ValueError(f"features file {path} has unknown rule types {bad_types}; allowed: {list(RULE_TYPES)}")
    return frame.sort_values("rule").reset_index(drop=True), meta
