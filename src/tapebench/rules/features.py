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
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ..ca.packed import pack, step_words_rules
from ..validation import check_integer, check_length, check_rules
from .mirror import class_representative, mirror_rule, reflect_tape

FEATURE_NAMES = ("density", "density_std", "activity", "activity_2step", "entropy", "block_entropy")
RULE_TYPES = ("stable", "periodic", "chaotic")
STABLE_MAX_ACTIVITY, STABLE_MAX_ENTROPY = 0.06, 0.25
CHAOTIC_MIN_ACTIVITY, CHAOTIC_MIN_ENTROPY = 0.22, 0.55
MAX_TRIALS, MAX_STEPS = 4096, 4096


@dataclass(frozen=True)
class FeatureProtocol:
    """How the rollouts behind the features are simulated."""

    L: int = 32
    """tape length (the benchmark's default L, so features describe the dynamics agents face)"""
    trials: int = 64
    """random start tapes per rule; each is also run reflected, so 2*trials rollouts"""
    steps: int = 64
    """CA updates per rollout; statistics cover all of them (no burn-in)"""
    seed: int = 0
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


def solved_by_any_action(rule: int) -> bool:
    """Whether every action reaches the all-zero goal in one step from every tape: the rule maps every
    neighbourhood to 0 (of the elementary rules, only rule 0). Such a test rule is solved without any
    inference or control, so tables report how many test rules are of this kind."""
    from ..ca.reference import ca_step

    z = check_rules([rule])[0]
    return all(ca_step(np.array(bits, dtype=np.uint8), z).sum() == 0
               for bits in ((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)))


def rule_type(activity: float, entropy: float) -> str:
    if activity < STABLE_MAX_ACTIVITY and entropy < STABLE_MAX_ENTROPY:
        return "stable"
    if activity > CHAOTIC_MIN_ACTIVITY and entropy > CHAOTIC_MIN_ENTROPY:
        return "chaotic"
    return "periodic"


def start_tapes(protocol: FeatureProtocol) -> np.ndarray:
    """(2*trials, L) uint8: the random tapes followed by their reflections."""
    rng = np.random.default_rng(protocol.seed)
    tapes = rng.integers(0, 2, size=(protocol.trials, protocol.L), dtype=np.uint8)
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


def _binary_entropy(p: np.ndarray) -> np.ndarray:
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
    entropy_of_count = _binary_entropy(np.arange(L + 1) / L)
    count_hist = np.stack([np.bincount(ones[:, r].ravel(), minlength=L + 1) for r in range(ones.shape[1])])
    entropy = count_hist @ entropy_of_count / (T * rollouts)
    density_std = np.sort((ones / L).std(axis=0), axis=1).mean(axis=1)      # std over time per rollout
    block_p = np.sort(_block_counts(words[1:], L) / (T * rollouts * L), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        block_entropy = np.where(block_p > 0, -block_p * np.log2(block_p), 0.0).sum(axis=1) / 3
    return np.stack([density, density_std, activity, activity_2step, entropy, block_entropy], axis=1)


def rule_features(rules=None, protocol: FeatureProtocol | None = None) -> pd.DataFrame:
    """One row per rule: rule, mirror_rule, mirror_class, type, then FEATURE_NAMES columns."""
    protocol = protocol or FeatureProtocol()
    rules = sorted(set(check_rules(range(256) if rules is None else rules)))
    stats = rule_statistics(rules, protocol)
    frame = pd.DataFrame(stats, columns=list(FEATURE_NAMES))
    frame.insert(0, "rule", np.asarray(rules, dtype=np.int64))
    frame.insert(1, "mirror_rule", np.asarray([mirror_rule(r) for r in rules], dtype=np.int64))
    frame.insert(2, "mirror_class", np.asarray([class_representative(r) for r in rules], dtype=np.int64))
    frame.insert(3, "type", [rule_type(a, e) for a, e in zip(frame["activity"], frame["entropy"])])
    return frame


def features_config(protocol: FeatureProtocol) -> dict:
    """The config slice recorded with the features artifact."""
    return {"protocol": protocol.as_dict(), "feature_names": list(FEATURE_NAMES),
            "thresholds": {"stable": {"activity_below": STABLE_MAX_ACTIVITY, "entropy_below": STABLE_MAX_ENTROPY},
                           "chaotic": {"activity_above": CHAOTIC_MIN_ACTIVITY,
                                       "entropy_above": CHAOTIC_MIN_ENTROPY}}}


def write_features(path, protocol: FeatureProtocol | None = None, rules=None) -> pd.DataFrame:
    from ..utils.io import provenance, write_parquet

    protocol = protocol or FeatureProtocol()
    frame = rule_features(rules, protocol)
    write_parquet(path, frame, meta=provenance(features_config(protocol), seed=protocol.seed))
    return frame


def read_features(path) -> tuple[pd.DataFrame, dict]:
    """Load a features artifact and check it has what splits need; returns (frame, metadata)."""
    from pathlib import Path

    from ..utils.artifacts import CorruptArtifact
    from ..utils.io import read_parquet_meta

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"features file not found: {path} (create it with `tapebench features --out {path}`)")
    try:
        frame = pd.read_parquet(path)
        meta = read_parquet_meta(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {exc}") from None
    feature_names = meta.get("config", {}).get("feature_names", list(FEATURE_NAMES))
    missing = [c for c in ("rule", "type", *feature_names) if c not in frame.columns]
    if missing:
        raise ValueError(f"features file {path} is missing columns {missing}")
    if frame["rule"].duplicated().any():
        dup = sorted(frame.loc[frame["rule"].duplicated(), "rule"].tolist())
        raise ValueError(f"features file {path} lists rules more than once: {dup}")
    check_rules(frame["rule"].tolist())
    bad_types = sorted(set(frame["type"]) - set(RULE_TYPES))
    if bad_types:
        raise ValueError(f"features file {path} has unknown rule types {bad_types}; allowed: {list(RULE_TYPES)}")
    return frame.sort_values("rule").reset_index(drop=True), meta
