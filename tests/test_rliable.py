"""rliable-style aggregates (tapebench.stats.rliable): IQM and friends, stratified bootstrap, probability of
improvement, performance profiles, and the per-rule table adapter. Each test checks a closed form or a
hand computation."""
import functools
import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from tapebench.stats import rliable as R
from tapebench.stats.aggregate import seed_tables
from tapebench.stats.bootstrap import percentile_interval

# --- aggregates ----------------------------------------------------------------------------------------


def test_iqm_of_0_to_99_is_49_5_and_ignores_outliers():
    x = np.arange(100.0)
    assert R.iqm(x) == 49.5                      # mean of 25..74
    wild = x.copy()
    wild[:3] = -1e9                              # the lowest and highest quarters may be anything
    wild[-5:] = 1e12
    assert R.iqm(wild) == 49.5
    assert R.iqm(np.random.default_rng(0).permutation(wild)) == 49.5


def test_iqm_trims_floor_of_a_quarter_from_each_end():
    # 10 scores: floor(2.5) = 2 dropped at each end, the middle six averaged with equal weight
    assert R.iqm([0, 1, 2, 3, 4, 5, 6, 7, 8, 100]) == pytest.approx((2 + 3 + 4 + 5 + 6 + 7) / 6)


def test_iqm_of_a_matrix_is_the_pooled_trimmed_mean():
    x = np.random.default_rng(1).normal(size=(7, 9))        # 63 scores: 15 trimmed each side
    pooled = np.sort(x.ravel())
    assert R.iqm(x) == pytest.approx(pooled[15:48].mean(), rel=1e-13)
    assert R.iqm(x) == pytest.approx(sps.trim_mean(x.ravel(), 0.25), rel=1e-13)
    assert R.iqm(x.T) == pytest.approx(R.iqm(x), rel=1e-13)  # pooling: the layout does not matter


def test_mean_median_and_optimality_gap_closed_forms():
    x = np.array([[0.0, 0.25, 1.5],
                  [1.0, 0.25, 0.5]])                         # per-task means 0.5, 0.25, 1.0
    assert R.mean(x) == pytest.approx(3.5 / 6)
    assert R.median(x) == 0.5                                # of the task means (pooled median: 0.375)
    assert R.optimality_gap(x) == pytest.approx(1.0 - (0 + 0.25 + 1 + 1 + 0.25 + 0.5) / 6)   # 1.5 counts as 1
    assert R.optimality_gap(x, gamma=0.5) == pytest.approx(0.5 - 2.0 / 6)
    # a stack of matrices is reduced matrix by matrix
    stack = np.stack([x, x + 1.0, np.zeros_like(x)])
    for fn in (R.mean, R.median, R.iqm, R.optimality_gap):
        np.testing.assert_allclose(fn(stack), [fn(x), fn(x + 1.0), fn(np.zeros_like(x))], rtol=1e-13)


# --- stratified bootstrap ------------------------------------------------------------------------------


def test_constant_tasks_give_a_zero_width_interval_at_the_exact_value():
    # tasks with constant but different values: resampling runs within a task changes nothing; mixing tasks
    # would move every statistic
    x = np.tile([1.0, 10.0, 100.0], (6, 1))
    got = R.stratified_bootstrap_ci({"m": x}, R.mean, n_resamples=500, rng=3)["m"]
    assert (got.point, got.low, got.high) == (37.0, 37.0, 37.0)
    assert (got.n_runs, got.n_tasks, got.n_resamples, got.ci) == (6, 3, 500, 0.95)
    iqm = R.stratified_bootstrap_ci({"m": x}, R.iqm, n_resamples=500, rng=3)["m"]
    # 18 pooled scores, 4 trimmed at each end: 1, 1, 10 x 6, 100, 100
    assert iqm.point == pytest.approx(262 / 10) and iqm.low == iqm.high == iqm.point
    med = R.stratified_bootstrap_ci({"m": x}, R.median, n_resamples=500, rng=3)["m"]
    assert (med.point, med.low, med.high) == (10.0, 10.0, 10.0)


def test_every_resampled_column_comes_from_its_own_task():
    n_runs, n_tasks = 5, 4
    x = 100.0 * np.arange(n_tasks)[None, :] + np.arange(n_runs)[:, None]     # task m holds 100 m + run
    def own_task(s):
        return float(np.all(s // 100 == np.arange(n_tasks)))
    got = R.stratified_bootstrap_ci({"m": x}, own_task, n_resamples=300, rng=0, batched=False)["m"]
    assert (got.low, got.high) == (1.0, 1.0)
    idx = R.stratified_resample_indices(n_runs, n_tasks, n_resamples=300, rng=0)
    assert idx.shape == (300, n_runs, n_tasks) and idx.min() >= 0 and idx.max() < n_runs
    # runs are drawn with replacement, independently per task
    assert any(len(set(idx[b, :, 0])) < n_runs for b in range(300))
    assert np.any(idx[:, :, 0] != idx[:, :, 1])


def test_stratified_bootstrap_variance_of_the_mean_is_the_within_task_closed_form():
    # Var*(mean of a stratified resample) = sum_m var_biased(x[:, m]) / (N M^2); a pooled (unstratified)
    # bootstrap would add the between-task spread
    x = np.array([[0.0, 10.0, 3.0], [1.0, 12.0, 3.0], [2.0, 11.0, 5.0], [5.0, 10.0, 4.0]])
    n, m = x.shape
    boot = R.stratified_bootstrap(x, R.mean, n_resamples=40_000, rng=11)
    expected = x.var(axis=0).sum() / (n * m * m)
    assert boot.mean() == pytest.approx(x.mean(), abs=5 * np.sqrt(expected / boot.size))
    assert boot.var() == pytest.approx(expected, rel=5 * np.sqrt(2.0 / boot.size))
    assert expected < x.var() / (n * m) / 5


def test_percentile_interval_of_the_resampled_aggregate_and_vector_aggregates():
    x = np.random.default_rng(2).random((8, 5))
    got = R.stratified_bootstrap_ci({"a": x}, R.iqm, n_resamples=700, rng=4)["a"]
    # a dict gives each method its own keyed generator: recompute by hand from the same resamples
    idx = R.stratified_resample_indices(8, 5, 700, R.method_generators(4, ["a"])["a"])
    manual = np.array([sps.trim_mean(x[i, np.arange(5)].ravel(), 0.25) for i in idx])
    assert got.point == R.iqm(x)
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(manual, [2.5, 97.5])), rel=1e-13)
    assert got.low < got.point < got.high

    def both(s):
        return np.stack([R.mean(s), R.iqm(s)], axis=-1)
    vec = R.stratified_bootstrap_ci({"a": x}, both, n_resamples=700, rng=4)["a"]
    assert vec.point.shape == (2,) and vec.low[1] == got.low and vec.high[1] == got.high
    # a plain function of one matrix must be flagged as such, and then gives the same numbers
    with pytest.raises(ValueError, match="batched=False"):
        R.stratified_bootstrap_ci({"a": x}, lambda s: float(np.mean(s)), n_resamples=10)
    plain = R.stratified_bootstrap_ci({"a": x}, lambda s: float(np.mean(s)), 700, rng=4, batched=False)["a"]
    batched = R.stratified_bootstrap_ci({"a": x}, R.mean, 700, rng=4)["a"]
    assert (plain.low, plain.high) == pytest.approx((batched.low, batched.high), rel=1e-12)
    og = R.stratified_bootstrap_ci({"a": x}, functools.partial(R.optimality_gap, gamma=0.5), 200, rng=4)["a"]
    assert og.point == pytest.approx(0.5 - np.minimum(x, 0.5).mean())


def test_percentile_ci_covers_the_true_mean_about_95_percent_of_the_time():
    mu = np.array([0.0, 1.0, 3.0, -2.0])                   # four tasks with different true means
    rng = np.random.default_rng(2021)
    hits = 0
    for _ in range(200):
        x = rng.normal(mu, 1.0, size=(20, 4))
        est = R.stratified_bootstrap_ci({"m": x}, R.mean, n_resamples=1000, rng=rng)["m"]
        hits += est.low <= mu.mean() <= est.high
    # nominal 0.95 (percentile bootstrap at n = 20 runs under-covers slightly); binomial sd ~ 0.016
    assert 0.89 <= hits / 200 <= 0.99


# --- probability of improvement -------------------------------------------------------------------------


def test_probability_of_improvement_identical_and_disjoint():
    x = np.random.default_rng(5).integers(0, 4, size=(6, 3)).astype(float)       # with ties
    assert R.probability_of_improvement(x, x) == 0.5
    assert R.probability_of_improvement(x, x[::-1]) == 0.5                         # same runs, other order
    high, low = x + 10.0, x[:4] - 10.0
    assert R.probability_of_improvement(high, low) == 1.0
    assert R.probability_of_improvement(low, high) == 0.0
    ci = R.probability_of_improvement_ci(high, low, n_resamples=200, rng=0)
    assert (ci.point, ci.low, ci.high) == (1.0, 1.0, 1.0)
    same = R.probability_of_improvement_ci(x, x, n_resamples=500, rng=0)
    assert same.point == 0.5 and same.low < 0.5 < same.high


def test_probability_of_improvement_hand_computed_with_ties():
    # task 1: x = 1, 2, 3 vs y = 2, 0 -> pairs 0, 1, 1/2, 1, 1, 1 -> 4.5 / 6 = 3/4
    # task 2: x = 0, 1, 1 vs y = 1, 1 -> pairs 0, 0, 1/2 x 4     -> 2 / 6   = 1/3
    x = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, 1.0]])
    y = np.array([[2.0, 1.0], [0.0, 1.0]])
    assert R.probability_of_improvement(x, y) == pytest.approx((3 / 4 + 1 / 3) / 2)
    assert R.probability_of_improvement(y, x) == pytest.approx(1 - (3 / 4 + 1 / 3) / 2)
    u = sps.mannwhitneyu(x, y, axis=0).statistic / (3 * 2)          # scipy's U of x, per task
    np.testing.assert_allclose(u, [3 / 4, 1 / 3])


def test_probability_of_improvement_is_antisymmetric():
    rng = np.random.default_rng(6)
    scores = {name: rng.integers(0, 5, size=(n, 7)) / 4.0 for name, n in (("a", 5), ("b", 8), ("c", 3))}
    for a, b in itertools.permutations(scores, 2):
        assert R.probability_of_improvement(scores[a], scores[b]) + R.probability_of_improvement(
            scores[b], scores[a]) == pytest.approx(1.0, abs=1e-14)
    mat = R.probability_of_improvement_matrix(scores, n_resamples=300, rng=1)
    assert mat.methods == ("a", "b", "c")
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose((mat.point + mat.point.T)[off], 1.0, atol=1e-14)
    np.testing.assert_allclose(mat.low[off], 1.0 - mat.high.T[off], atol=1e-14)
    assert np.all(np.diag(mat.point) == 0.5) and np.all(np.isnan(np.diag(mat.low)))
    assert np.all(mat.low[off] <= mat.point[off]) and np.all(mat.point[off] <= mat.high[off])
    frame = mat.frame()
    assert len(frame) == 6 and set(frame.columns) >= {"method_x", "method_y", "probability", "ci_low", "ci_high"}
    row = frame[(frame.method_x == "b") & (frame.method_y == "c")].iloc[0]
    assert row.probability == pytest.approx(R.probability_of_improvement(scores["b"], scores["c"]))


def test_probability_of_improvement_bootstrap_matches_a_brute_force_pair_count():
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, 3, size=(4, 3)).astype(float), rng.integers(0, 3, size=(3, 3)).astype(float)
    got = R.probability_of_improvement_ci(x, y, n_resamples=60, rng=9)
    gen = np.random.default_rng(9)                       # draws: x's block, then y's block, from one generator
    ix = gen.integers(0, 4, size=(60, 4, 3))
    iy = gen.integers(0, 3, size=(60, 3, 3))
    boot = []
    for b in range(60):
        per_task = []
        for m in range(3):
            xs, ys = x[ix[b, :, m], m], y[iy[b, :, m], m]
            per_task.append(np.mean([1.0 if a > c else 0.5 if a == c else 0.0 for a in xs for c in ys]))
        boot.append(np.mean(per_task))
    low, high = percentile_interval(np.array(boot), 0.95)
    assert (got.low, got.high) == pytest.approx((low, high), abs=1e-12)


# --- performance profiles -------------------------------------------------------------------------------


def test_performance_profiles_are_step_functions_at_known_taus():
    x = np.array([[0.125, 0.5], [0.375, 0.875]])        # task means 0.25 and 0.6875
    taus = [0.0, 0.125, 0.25, 0.375, 0.5, 0.875, 1.0]
    np.testing.assert_array_equal(R.run_score_distribution(x, taus), [1, 0.75, 0.75, 0.5, 0.25, 0, 0])
    np.testing.assert_array_equal(R.average_score_distribution(x, [0, 0.25, 0.5, 0.6875, 1]), [1, 0.5, 0.5, 0, 0])
    prof = R.performance_profile(x, taus, n_resamples=400, rng=0)
    np.testing.assert_array_equal(prof.point, [1, 0.75, 0.75, 0.5, 0.25, 0, 0])
    assert prof.kind == "run" and np.all(np.diff(prof.low) <= 0) and np.all(np.diff(prof.high) <= 0)
    assert np.all((0 <= prof.low) & (prof.low <= prof.point) & (prof.point <= prof.high) & (prof.high <= 1))


def test_profile_bands_of_constant_tasks_have_zero_width():
    x = np.tile([0.25, 0.5, 0.75, 1.0], (5, 1))
    taus = np.linspace(0, 1, 9)
    for kind in R.PROFILE_KINDS:
        prof = R.performance_profile(x, taus, kind=kind, n_resamples=300, rng=1)
        np.testing.assert_array_equal(prof.low, prof.point)
        np.testing.assert_array_equal(prof.high, prof.point)


@pytest.mark.parametrize("kind", R.PROFILE_KINDS)
def test_profile_bands_match_the_definition_on_the_same_resamples(kind):
    x = np.random.default_rng(8).integers(0, 5, size=(6, 4)) / 4.0
    taus = np.linspace(-0.1, 1.1, 13)
    prof = R.performance_profile(x, taus, kind=kind, n_resamples=300, rng=5)
    idx = R.stratified_resample_indices(6, 4, n_resamples=300, rng=5)
    fn = R.run_score_distribution if kind == "run" else R.average_score_distribution
    boot = np.array([fn(x[i, np.arange(4)], taus) for i in idx])
    low, high = percentile_interval(boot, 0.95)
    np.testing.assert_allclose(prof.low, low, atol=1e-12)
    np.testing.assert_allclose(prof.high, high, atol=1e-12)


# --- determinism and input checks -----------------------------------------------------------------------


def test_fixed_seed_gives_identical_results_and_other_methods_change_nothing():
    rng = np.random.default_rng(10)
    scores = {"a": rng.random((5, 6)), "b": rng.random((7, 6)), "c": rng.random((4, 6))}
    taus = np.linspace(0, 1, 11)

    def everything(d, seed):
        return (R.stratified_bootstrap_ci(d, R.iqm, 300, rng=seed), R.performance_profiles(d, taus, n_resamples=300,
                rng=seed), R.probability_of_improvement_matrix(d, 300, rng=seed))

    first, again = everything(scores, 0), everything(scores, 0)
    assert first[0] == again[0]
    for name in scores:
        np.testing.assert_array_equal(first[1][name].low, again[1][name].low)
    np.testing.assert_array_equal(first[2].low, again[2].low)
    other = everything(scores, 1)
    assert other[0]["a"] != first[0]["a"]
    # a Generator is consumed deterministically too
    g1 = R.stratified_bootstrap_ci(scores, R.iqm, 300, rng=np.random.default_rng(3))
    assert g1 == R.stratified_bootstrap_ci(scores, R.iqm, 300, rng=np.random.default_rng(3))
    # dropping a method leaves the others' numbers as they were
    fewer = everything({"a": scores["a"], "c": scores["c"]}, 0)
    assert fewer[0]["a"] == first[0]["a"] and fewer[0]["c"] == first[0]["c"]
    np.testing.assert_array_equal(fewer[1]["c"].high, first[1]["c"].high)
    assert fewer[2].low[0, 1] == first[2].low[0, 2] and fewer[2].high[0, 1] == first[2].high[0, 2]
    single = R.probability_of_improvement_ci(scores["a"], scores["b"], 300, rng=0)
    assert single == R.probability_of_improvement_ci(scores["a"], scores["b"], 300, rng=0)


def test_bad_scores_and_settings_are_refused():
    x = np.zeros((3, 4))
    with pytest.raises(ValueError, match="same tasks"):
        R.stratified_bootstrap_ci({"a": x, "b": np.zeros((3, 5))}, R.mean)
    with pytest.raises(ValueError, match="same tasks"):
        R.probability_of_improvement(x, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        R.iqm([[0.0, np.nan]])
    with pytest.raises(ValueError, match="empty"):
        R.stratified_bootstrap_ci({}, R.mean)
    with pytest.raises(ValueError, match="ci"):
        R.stratified_bootstrap_ci({"a": x}, R.mean, ci=95)
    with pytest.raises(ValueError, match="n_resamples"):
        R.performance_profile(x, [0.5], n_resamples=0)
    with pytest.raises(ValueError, match="kind"):
        R.performance_profile(x, [0.5], kind="median")
    with pytest.raises(ValueError, match="rng"):
        R.stratified_bootstrap(x, R.mean, rng="zero")


# --- the per-rule table adapter -------------------------------------------------------------------------


def per_rule_rows(agent, seeds, rules, value=lambda a, s, r: s + r / 100, split="main", H=32, L=32,
                  side="test", metric="success"):
    return [{"split": split, "agent": agent, "L": L, "H": H, "seed": s, "side": side, "rule": r, "type": "chaotic",
             "metric": metric, "value": value(agent, s, r), "k_used": 3, "n_episodes": 6}
            for s in seeds for r in rules]


def per_rule_table():
    rows = (per_rule_rows("ppo", [0, 1], [30, 110, 90]) + per_rule_rows("dqn", [3, 1, 2], [110, 30, 90])
            + per_rule_rows("dqn", [1], [1, 2], side="train") + per_rule_rows("dqn", [1], [30], metric="return"))
    return pd.DataFrame(rows)


def test_score_matrices_are_seeds_by_rules_with_labels():
    got = R.score_matrices(per_rule_table())
    assert list(got) == ["dqn", "ppo"]
    assert got.rules.tolist() == [30, 90, 110]
    assert got.seeds["dqn"].tolist() == [1, 2, 3] and got.seeds["ppo"].tolist() == [0, 1]   # seeds may differ
    np.testing.assert_allclose(got["dqn"], [[1.30, 1.90, 2.10], [2.30, 2.90, 3.10], [3.30, 3.90, 4.10]])
    assert got["ppo"].shape == (2, 3)
    assert got.selection == {"metric": "success", "side": "test", "split": "main", "L": 32, "H": 32}
    assert got.types == {30: "chaotic", 90: "chaotic", 110: "chaotic"}
    only = R.score_matrices(per_rule_table(), agents=["ppo"])
    assert list(only) == ["ppo"]
    assert R.iqm(got["dqn"]) == pytest.approx(sps.trim_mean(got["dqn"].ravel(), 0.25))


def test_score_matrices_from_the_seed_stage():
    rows = []
    for agent, seed, hits in (("dqn", 0, {1: 2, 2: 1}), ("dqn", 1, {1: 0, 2: 2}), ("ppo", 4, {1: 1, 2: 1})):
        for checkpoint in (10, 20):
            for rule in (1, 2):
                for k in range(2):
                    ok = k < hits[rule]
                    rows.append({"agent": agent, "seed": seed, "checkpoint": checkpoint, "split": "main",
                                 "side": "test", "rule": rule, "type": "periodic", "episode": k, "L": 8, "H": 16,
                                 "success": ok, "final_dist": 0.0 if ok else 0.5, "auc_dist": 0.1,
                                 "return": 1.0 if ok else 0.0, "steps": 4})
    per_rule = seed_tables(pd.DataFrame(rows), last_k=2)["per_rule"]
    got = R.score_matrices(per_rule)
    np.testing.assert_array_equal(got["dqn"], [[1.0, 0.5], [0.0, 1.0]])
    np.testing.assert_array_equal(got["ppo"], [[0.5, 0.5]])
    assert got.selection["H"] == 16 and got.types == {1: "periodic", 2: "periodic"}


def test_score_matrices_errors_name_what_is_missing():
    table = per_rule_table()
    with pytest.raises(ValueError, match=r"lacks columns \['rule'\]"):
        R.score_matrices(table.drop(columns="rule"))
    with pytest.raises(ValueError, match="metric='soft'.*present"):
        R.score_matrices(table, metric="soft")
    with pytest.raises(ValueError, match="side='rules'"):
        R.score_matrices(table, side="rules")
    two_splits = pd.concat([table, table.assign(split="alt")])
    with pytest.raises(ValueError, match="several values of 'split'.*'alt', 'main'"):
        R.score_matrices(two_splits)
    assert R.score_matrices(two_splits, split="alt")["ppo"].shape == (2, 3)
    with pytest.raises(ValueError, match="H=64"):
        R.score_matrices(table, H=64)
    with pytest.raises(ValueError, match="several values of 'H'"):
        R.score_matrices(pd.concat([table, table.assign(H=64)]))
    with pytest.raises(ValueError, match=r"agent\(s\) \['sac'\]"):
        R.score_matrices(table, agents=["ppo", "sac"])
    with pytest.raises(ValueError, match="duplicated per-rule rows"):
        R.score_matrices(pd.concat([table, table.iloc[:1]]))
    with pytest.raises(ValueError, match="NaN"):
        R.score_matrices(table.assign(value=np.where(table.index == 0, np.nan, table["value"])))
    hole = table[~((table.agent == "dqn") & (table.seed == 2) & (table.rule == 90))]
    with pytest.raises(ValueError, match=r"'dqn'.*seed 2 has no value for rule\(s\) \[90\]"):
        R.score_matrices(hole)
    other_rules = pd.concat([table[~((table.agent == "ppo") & (table.rule == 110))],
                             pd.DataFrame(per_rule_rows("ppo", [0, 1], [54]))])
    with pytest.raises(ValueError, match=r"'ppo' lacks rules \[110\] that 'dqn' has, and has rules \[54\]"):
        R.score_matrices(other_rules)
