"""Uncertainty over training seeds (docs/protocol.md#statistics, paper App. K).

- `percentile_ci`: percentile bootstrap of the mean of per-seed values: B resamples of the n seeds with
  replacement, the mean of each, and the (1-ci)/2, (1+ci)/2 percentiles of those B means (numpy's default
  linear interpolation). The point estimate is the sample mean, not the mean of the bootstrap means.
- `paired_ci`: the ID–OOD drop. Seeds are resampled as pairs (x_i, y_i), which is exactly the bootstrap of
  the per-seed differences d_i = x_i - y_i with the same resampled indices.
- `difference_ci`: two independent groups (two methods): each group resampled on its own.
- `welch_test`, `holm`, `hedges_g`: diagnostics between methods (Welch's unequal-variance t-test,
  Holm's step-down family-wise correction, bias-corrected standardised mean difference).

Every resampling function takes either a `numpy.random.Generator` or an integer seed, so results are
deterministic. Resamples are drawn as one (B, n) index matrix and reduced in a single vectorised step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tapebench.defaults import CI, N_RESAMPLES


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval."""

    mean: float
    low: float
    high: float
    n: int


def _generator(rng) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    raise ValueError(f"rng must be a numpy Generator or an integer seed, got {type(rng).__name__}")


def _check_settings(n_resamples: int, ci: float) -> None:
    if not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), e.g. 0.95; got {ci!r}")


def _as_sample(values, name: str = "values") -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per seed), got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} is empty: need at least one seed")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values: {x[~np.isfinite(x)][:5].tolist()}")
    return x


def resample_indices(n: int, n_resamples: int = N_RESAMPLES, rng=0) -> np.ndarray:
    """A (n_resamples, n) matrix of indices drawn uniformly with replacement from 0..n-1."""
    if n < 1:
        raise ValueError(f"need at least one seed to resample, got n = {n}")
    _check_settings(n_resamples, CI)
    return _generator(rng).integers(0, n, size=(n_resamples, n))


def bootstrap_means(values, n_resamples: int = N_RESAMPLES, rng=0, indices=None) -> np.ndarray:
    """Means of bootstrap resamples of `values` (n,) or of each column of `values` (n, m).

    Returns shape (B,) or (B, m). Pass `indices` (B, n) to reuse one resampling across calls.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"values must have shape (n,) or (n, m) with n >= 1, got {x.shape}")
    if indices is None:
        indices = resample_indices(x.shape[0], n_resamples, rng)
    elif indices.ndim != 2 or indices.shape[1] != x.shape[0]:
        raise ValueError(f"indices must have shape (B, {x.shape[0]}), got {indices.shape}")
    return x[indices].mean(axis=1)


def percentile_interval(boot_means: np.ndarray, ci: float = CI) -> tuple[np.ndarray, np.ndarray]:
    """The (1-ci)/2 and (1+ci)/2 percentiles of bootstrap means along axis 0."""
    _check_settings(1, ci)
    tail = 100.0 * (1.0 - ci) / 2.0
    low, high = np.percentile(boot_means, [tail, 100.0 - tail], axis=0)
    return low, high


def percentile_ci(values, n_resamples: int = N_RESAMPLES, ci: float = CI, rng=0,
                  indices=None) -> Interval:
    """Percentile bootstrap CI of the mean of per-seed values (paper App. K.1)."""
    x = _as_sample(values)
    _check_settings(n_resamples, ci)
    boot = bootstrap_means(x, n_resamples, rng, indices)
    low, high = percentile_interval(boot, ci)
    return Interval(float(x.mean()), float(low), float(high), int(x.size))


def paired_ci(x, y, n_resamples: int = N_RESAMPLES, ci: float = CI, rng=0,
              indices=None) -> Interval:
    """Paired bootstrap CI of mean(x - y): seeds resampled together (paper App. K.2, the ID–OOD drop)."""
    x, y = _as_sample(x, "x"), _as_sample(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"paired samples need one x and one y per seed; got {x.size} and {y.size} values")
    return percentile_ci(x - y, n_resamples, ci, rng, indices)


def difference_ci(a, b, n_resamples: int = N_RESAMPLES, ci: float = CI, rng=0) -> Interval:
    """Bootstrap CI of mean(a) - mean(b) for independent groups (each group resampled separately)."""
    a, b = _as_sample(a, "a"), _as_sample(b, "b")
    _check_settings(n_resamples, ci)
    gen = _generator(rng)
    boot = (bootstrap_means(a, indices=resample_indices(a.size, n_resamples, gen))
            - bootstrap_means(b, indices=resample_indices(b.size, n_resamples, gen)))
    low, high = percentile_interval(boot, ci)
    return Interval(float(a.mean() - b.mean()), float(low), float(high), int(min(a.size, b.size)))


@dataclass(frozen=True)
class WelchResult:
    statistic: float
    df: float
    p_value: float


def welch_test(a, b) -> WelchResult:
    """Welch's two-sided t-test (unequal variances). NaN when undefined (n < 2 or both variances 0)."""
    a, b = _as_sample(a, "a"), _as_sample(b, "b")
    if a.size < 2 or b.size < 2:
        return WelchResult(math.nan, math.nan, math.nan)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0.0:
        return WelchResult(math.nan, math.nan, math.nan)
    # scipy.stats takes about a second to import: only the Welch tests of `tapebench aggregate` load it
    from scipy import stats as sps

    res = sps.ttest_ind(a, b, equal_var=False)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return WelchResult(float(res.statistic), float(df), float(res.pvalue))


def holm(p_values) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error control). NaN entries are left out of the
    family and stay NaN.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be one-dimensional, got shape {p.shape}")
    valid = ~np.isnan(p)
    if np.any((p[valid] < 0) | (p[valid] > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {p[valid][(p[valid] < 0) | (p[valid] > 1)].tolist()}")
    out = np.full(p.shape, np.nan)
    pv = p[valid]
    m = pv.size
    if m == 0:
        return out
    order = np.argsort(pv, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * pv[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    out[valid] = adjusted
    return out


def hedges_g(a, b) -> float:
    """Standardised mean difference (mean(a) - mean(b)) / pooled sd, with Hedges' small-sample correction.

    NaN when undefined (fewer than 3 values in all, or zero pooled variance).
    """
    a, b = _as_sample(a, "a"), _as_sample(b, "b")
    dof = a.size + b.size - 2
    if dof < 1:
        return math.nan
    pooled_var = ((a.size - 1) * a.var(ddof=1 if a.size > 1 else 0)
                  + (b.size - 1) * b.var(ddof=1 if b.size > 1 else 0)) / dof
    if pooled_var == 0.0:
        return math.nan
    correction = 1.0 - 3.0 / (4.0 * dof - 1.0)
    return float(correction * (a.mean() - b.mean()) / math.sqrt(pooled_var))
