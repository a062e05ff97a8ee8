"""Rule-dependent headroom and the floor-normalised score (docs/protocol.md#rule-agnostic-floors): pure functions
on arrays, no I/O.

The rule-agnostic floor of a protocol is the best (highest mean success) of the rule-agnostic rows, the methods
whose policy never uses the rule (registry flag `rule_agnostic`). The rule-dependent headroom is the reference's
(true-dynamics MPC's) success minus the floor's: what knowing the rule buys a planner. The normalised score puts
a method's success p on the scale floor = 0, reference = 100:  100 (p - p_floor) / (p_ref - p_floor).
"""
from __future__ import annotations

import numpy as np

from tapebench.defaults import CI, N_RESAMPLES
from tapebench.stats.bootstrap import (Interval, _as_sample, _check_settings, _generator, difference_ci, paired_ci,
                                       percentile_interval, resample_indices)


def best_floor(samples: dict[str, np.ndarray]) -> str:
    """The rule-agnostic row with the highest mean (ties: the first id in sorted order)."""
    if not samples:
        raise ValueError("the rule-agnostic floor needs at least one rule-agnostic row (registry flag "
                         "rule_agnostic: live_leftmost, live_random, mpc_prior, random)")
    return max(sorted(samples), key=lambda name: float(np.mean(_as_sample(samples[name], name))))


def normalised_score(p, floor, reference):
    """100 (p - floor) / (reference - floor), elementwise; NaN where the reference does not exceed the floor."""
    p, floor, reference = (np.asarray(x, dtype=np.float64) for x in (p, floor, reference))
    span = reference - floor
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span > 0, 100.0 * (p - floor) / np.where(span > 0, span, 1.0), np.nan)


def headroom_ci(reference, floor, *, paired: bool, n_resamples: int = N_RESAMPLES, ci: float = CI,
                rng=0) -> Interval:
    """Bootstrap CI of mean(reference) - mean(floor). `paired`: the two are values of the same units (rules of
    one split: resampled together); else independent samples (seeds of two methods: each resampled alone)."""
    reference, floor = _as_sample(reference, "reference"), _as_sample(floor, "floor")
    if paired:
        return paired_ci(reference, floor, n_resamples=n_resamples, ci=ci, rng=rng)
    return difference_ci(reference, floor, n_resamples=n_resamples, ci=ci, rng=rng)


def normalised_score_ci(values, floor, reference, n_resamples: int = N_RESAMPLES, ci: float = CI,
                        rng=0) -> Interval:
    """The normalised score of the mean of `values` (per-seed successes) with a bootstrap CI resampling the
    method's, the floor's and the reference's seeds independently. A resample whose reference does not exceed
    its floor has no score; the interval is taken over the others, and is NaN when they are fewer than `ci` of
    all resamples (the headroom's own CI then reaches 0: no scale to put the method on)."""
    values, floor, reference = (_as_sample(x, name) for x, name in
                                ((values, "values"), (floor, "floor"), (reference, "reference")))
    _check_settings(n_resamples, ci)
    gen = _generator(rng)
    boot = [x[resample_indices(len(x), n_resamples, gen)].mean(axis=1) for x in (values, floor, reference)]
    scores = normalised_score(*boot)
    finite = scores[np.isfinite(scores)]
    low, high = percentile_interval(finite, ci) if finite.size >= ci * scores.size else (np.nan, np.nan)
    mean = float(normalised_score(values.mean(), floor.mean(), reference.mean()))
    return Interval(mean, float(low), float(high), len(values))
