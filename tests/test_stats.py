"""Bootstrap, paired drop, Welch/Holm and effect sizes (tapebench.stats.bootstrap)."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from tapebench.stats.bootstrap import (bootstrap_means, difference_ci, hedges_g, holm, paired_ci, percentile_ci,
                                       resample_indices, welch_test)


def test_bootstrap_distribution_matches_closed_form_moments():
    # the bootstrap mean of n values has expectation = sample mean and variance = biased var / n
    x = np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 0], dtype=float)
    B = 200_000
    boot = bootstrap_means(x, n_resamples=B, rng=123)
    expected_var = x.var(ddof=0) / x.size
    mc_se_mean = math.sqrt(expected_var / B)
    assert abs(boot.mean() - x.mean()) < 5 * mc_se_mean
    # sd of a sample variance estimate of an (approximately normal) statistic: var * sqrt(2 / B)
    assert abs(boot.var() - expected_var) < 5 * expected_var * math.sqrt(2.0 / B)


def test_bootstrap_moments_for_continuous_values():
    x = np.array([0.1, 0.4, 0.35, 0.8, 0.05, 0.6, 0.2])
    B = 200_000
    boot = bootstrap_means(x, n_resamples=B, rng=7)
    expected_var = x.var(ddof=0) / x.size
    assert abs(boot.mean() - x.mean()) < 5 * math.sqrt(expected_var / B)
    assert abs(boot.var() - expected_var) < 5 * expected_var * math.sqrt(2.0 / B)


def test_constant_sample_gives_degenerate_interval():
    ci = percentile_ci([0.25] * 7, n_resamples=500, rng=0)
    assert (ci.mean, ci.low, ci.high, ci.n) == (0.25, 0.25, 0.25, 7)


def test_single_seed_gives_degenerate_interval():
    ci = percentile_ci([0.3], n_resamples=100, rng=0)
    assert (ci.low, ci.high) == (0.3, 0.3)


def test_two_binary_seeds_percentiles_are_zero_and_one():
    # resampled mean of {0, 1}: 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    boot = bootstrap_means([0.0, 1.0], n_resamples=20_000, rng=5)
    values, counts = np.unique(boot, return_counts=True)
    assert values.tolist() == [0.0, 0.5, 1.0]
    np.testing.assert_allclose(counts / counts.sum(), [0.25, 0.5, 0.25], atol=0.015)
    ci = percentile_ci([0.0, 1.0], n_resamples=2000, rng=5)
    assert (ci.mean, ci.low, ci.high) == (0.5, 0.0, 1.0)


def test_interval_contains_mean_and_narrows_with_level():
    x = np.random.default_rng(0).normal(size=20)
    wide = percentile_ci(x, ci=0.95, rng=1)
    narrow = percentile_ci(x, ci=0.5, rng=1)
    assert wide.low < narrow.low < x.mean() < narrow.high < wide.high


def test_percentiles_are_the_resampled_mean_quantiles():
    x = np.array([0.1, 0.3, 0.2, 0.9, 0.5])
    idx = resample_indices(x.size, 1000, np.random.default_rng(3))
    means = x[idx].mean(axis=1)
    ci = percentile_ci(x, indices=idx)
    assert ci.low == pytest.approx(np.percentile(means, 2.5))
    assert ci.high == pytest.approx(np.percentile(means, 97.5))


def test_determinism_with_seed_and_generator():
    x = np.arange(10.0)
    assert percentile_ci(x, rng=42) == percentile_ci(x, rng=42)
    assert percentile_ci(x, rng=np.random.default_rng(9)) == percentile_ci(x, rng=np.random.default_rng(9))
    assert percentile_ci(x, rng=42) != percentile_ci(x, rng=43)


def test_paired_bootstrap_equals_bootstrap_of_differences():
    rng = np.random.default_rng(0)
    x_id = rng.uniform(0.05, 0.1, size=20)
    x_ood = x_id - rng.uniform(0.0, 0.04, size=20)
    paired = paired_ci(x_id, x_ood, rng=11)
    diffs = percentile_ci(x_id - x_ood, rng=11)
    assert paired == diffs
    # pairing keeps the within-seed correlation: much tighter than treating the sides as independent
    unpaired = difference_ci(x_id, x_ood, rng=11)
    assert paired.high - paired.low < 0.5 * (unpaired.high - unpaired.low)
    assert paired.mean == pytest.approx(unpaired.mean)


def test_paired_needs_equal_lengths():
    with pytest.raises(ValueError, match="one x and one y per seed"):
        paired_ci([0.1, 0.2], [0.1])


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="empty"):
        percentile_ci([])
    with pytest.raises(ValueError, match="NaN"):
        percentile_ci([0.1, float("nan")])
    with pytest.raises(ValueError, match="ci must be in"):
        percentile_ci([0.1, 0.2], ci=95)
    with pytest.raises(ValueError, match="n_resamples"):
        percentile_ci([0.1, 0.2], n_resamples=0)


def test_holm_against_hand_computed_example():
    # sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> monotone 0.06)
    p = [0.03, 0.01, 0.04, 0.02]
    np.testing.assert_allclose(holm(p), [0.06, 0.04, 0.06, 0.06])
    # capped at 1 and monotone
    np.testing.assert_allclose(holm([0.5, 0.4, 0.001]), [0.8, 0.8, 0.003])
    # NaN (an undefined test) stays NaN and is not counted in the family
    np.testing.assert_allclose(holm([0.01, float("nan"), 0.04]), [0.02, np.nan, 0.04])


def test_welch_matches_scipy_and_formula():
    a = np.array([0.05, 0.07, 0.04, 0.06, 0.05, 0.08])
    b = np.array([0.03, 0.035, 0.05, 0.02, 0.04])
    res = welch_test(a, b)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert res.statistic == pytest.approx(ref.statistic)
    assert res.p_value == pytest.approx(ref.pvalue)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    assert res.statistic == pytest.approx((a.mean() - b.mean()) / math.sqrt(va + vb))
    assert res.df == pytest.approx((va + vb) ** 2 / (va**2 / 5 + vb**2 / 4))


def test_welch_undefined_cases_are_nan():
    assert math.isnan(welch_test([0.1], [0.2, 0.3]).p_value)
    assert math.isnan(welch_test([0.1, 0.1], [0.2, 0.2]).p_value)


def test_hedges_g_hand_computed():
    a, b = [1.0, 2.0, 3.0], [3.0, 4.0, 5.0]
    # pooled sd = 1, d = -2, J = 1 - 3 / (4 * 4 - 1) = 0.8
    assert hedges_g(a, b) == pytest.approx(-1.6)
    assert math.isnan(hedges_g([1.0, 1.0], [1.0, 1.0]))


def test_difference_ci_for_independent_groups():
    a = np.full(10, 0.5)
    b = np.array([0.0, 1.0] * 5)
    ci = difference_ci(a, b, n_resamples=4000, rng=0)
    assert ci.mean == pytest.approx(0.0)
    assert ci.low < 0 < ci.high
    # a has no spread, so the CI is the (negated) bootstrap CI of b's mean shifted by 0.5
    b_ci = percentile_ci(b, n_resamples=4000, rng=0)
    assert ci.high - ci.low == pytest.approx(b_ci.high - b_ci.low, abs=0.03)
