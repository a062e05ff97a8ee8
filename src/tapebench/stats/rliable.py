"""rliable-style aggregate statistics over runs and tasks (docs/protocol.md#statistics), on numpy/scipy only.

Definitions follow Agarwal, Schwarzer, Castro, Courville and Bellemare (2021), "Deep Reinforcement
Learning at the Edge of the Statistical Precipice", NeurIPS 2021 (arXiv:2108.13264). The rliable package
itself is not used (it does not import beside pandas 3) and none of its code
is copied; the statistics are written here from the paper's definitions.

Scores. A method's results are a score matrix ``x`` of shape (runs, tasks): ``x[n, m]`` is run n's score on
task m. In TAPE the tasks are rules and the runs are training seeds (`score_matrices` builds the matrices
from the per-rule Parquet table). Every method must have the same tasks in the same column order; the
number of runs may differ between methods. Write N for runs and M for tasks.

Aggregates (paper §4.2), each a function of one score matrix:
  mean(x)              (1/M) Σ_m (1/N) Σ_n x[n, m] — mean of the per-task means (= the pooled mean).
  median(x)            median over tasks of the per-task means (1/N) Σ_n x[n, m].
  iqm(x)               interquartile mean: the mean of the middle 50% of the N·M pooled scores. Trimming
                       convention as in the paper: ``scipy.stats.trim_mean(x.ravel(), 0.25)``, i.e. sort the
                       P = N·M pooled scores and drop floor(0.25·P) from each end (no fractional weights).
  optimality_gap(x, γ) γ − (1/(NM)) Σ_{n,m} min(x[n, m], γ): how far the scores fall short of a target γ
                       (default 1, i.e. strict success); scores above γ earn nothing. Lower is better.
Each aggregate also accepts a stack of matrices (..., runs, tasks) and reduces only the last two axes;
that is how the bootstrap evaluates all resamples at once. For another γ pass
``functools.partial(optimality_gap, gamma=γ)``.

Stratified bootstrap (paper §4.1, App. A.1). A resample draws, *independently for each task*, N run
indices uniformly with replacement and takes that task's scores of those runs: column m of a resample only
ever holds scores of task m (tasks are strata, never mixed). The aggregate of the resampled matrix, over
B resamples, gives a percentile confidence interval: the (1−ci)/2 and (1+ci)/2 percentiles (numpy's
linear interpolation, as `bootstrap.percentile_interval`). The point estimate is the aggregate of the
observed matrix, not a bootstrap average.

Probability of improvement (paper §4.3, App. A.4). For methods X (N runs) and Y (K runs) on the same M
tasks, P(X > Y) = (1/M) Σ_m P(X_m > Y_m) with
    P(X_m > Y_m) = (1/(N K)) Σ_i Σ_j S(x[i, m], y[j, m]),  S(a, b) = 1 if a > b, 1/2 if a = b, 0 if a < b,
which is the Mann–Whitney U statistic of X's runs against Y's runs on task m divided by N·K (computed here
from mid-ranks: U = Σ_i rank(x_i in x ∪ y) − N(N+1)/2). So P(X > Y) + P(Y > X) = 1 and P(X > X) = 1/2.
Its CI resamples X's runs and Y's runs independently within each task (the methods' seeds are different
training runs, not pairs). `probability_of_improvement_matrix` gives every ordered pair of methods.

Performance profiles (paper §4.2, App. A.3). For thresholds τ:
  run-score distribution      F(τ) = (1/(NM)) Σ_{n,m} 1[x[n, m] > τ]  (fraction of (run, task) scores > τ),
  average-score distribution  F(τ) = (1/M) Σ_m 1[(1/N) Σ_n x[n, m] > τ]  (fraction of tasks whose mean > τ),
both with pointwise stratified-bootstrap percentile bands.

Determinism. Every resampling function takes a `numpy.random.Generator` or an integer seed (as
`tapebench.stats.bootstrap`). Run indices are drawn in blocks of `RESAMPLE_BLOCK` resamples, each block as
one (block, N, M) integer array, so the numbers depend only on the seed and the shapes. Functions of a
dict of methods give each method its own generator, derived from the seed (an integer seed is used as is;
a Generator gives one draw) and the method's name, the way `aggregate.group_generator` does; a method's
interval therefore does not change when other methods are added or removed, and the resamples of a method
are the same for its aggregates, its profiles and its probabilities of improvement.

Scores where lower is better (final_dist, auc_dist, steps) should be negated (or turned into 1 − dist)
before probabilities of improvement and performance profiles, which read larger as better.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from tapebench.stats.aggregate import group_generator
from tapebench.defaults import CI, N_RESAMPLES
from tapebench.stats.bootstrap import _check_settings, _generator, percentile_interval

RESAMPLE_BLOCK = 256            # resamples drawn per (block, N, M) index array
_MAX_ELEMENTS = 1 << 22         # largest intermediate array (elements) a vectorised step builds
IQM_TRIM = 0.25
PROFILE_KINDS = ("run", "average")


# ---------------------------------------------------------------------------------------------------------
# Score matrices


def _as_scores(scores, name: str = "scores") -> np.ndarray:
    """A float array (..., runs, tasks); a 1-D array is read as one run over len(scores) tasks."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim < 2:
        raise ValueError(f"{name} must be a (runs x tasks) matrix, got shape {x.shape}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"{name} is empty: shape {x.shape} (need at least one run and one task)")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values: {x[~np.isfinite(x)][:5].tolist()}")
    return x


def _as_matrix(scores, name: str = "scores") -> np.ndarray:
    x = _as_scores(scores, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must be one (runs x tasks) matrix, got shape {x.shape}")
    return x


def _as_score_dict(score_dict) -> dict[str, np.ndarray]:
    if not isinstance(score_dict, Mapping):
        raise ValueError("score_dict must map method names to (runs x tasks) score matrices, "
                         f"got {type(score_dict).__name__}")
    if not score_dict:
        raise ValueError("score_dict is empty: need at least one method")
    out = {str(k): _as_matrix(v, f"scores of {k!r}") for k, v in score_dict.items()}
    tasks = {k: v.shape[1] for k, v in out.items()}
    if len(set(tasks.values())) > 1:
        raise ValueError(f"every method needs the same tasks (columns); tasks per method: {tasks}")
    return out


def _scalar(value):
    value = np.asarray(value, dtype=np.float64)
    return float(value) if value.ndim == 0 else value


# ---------------------------------------------------------------------------------------------------------
# Aggregates: functions of (..., runs, tasks) reducing the last two axes


def mean(scores):
    """Mean over tasks of the per-task mean over runs (the pooled mean of a full matrix)."""
    x = _as_scores(scores)
    return _scalar(x.mean(axis=-2).mean(axis=-1))


def median(scores):
    """Median over tasks of the per-task mean over runs."""
    x = _as_scores(scores)
    return _scalar(np.median(x.mean(axis=-2), axis=-1))


def iqm(scores):
    """Interquartile mean of the pooled (run, task) scores: scipy.stats.trim_mean(pooled, 0.25)."""
    x = _as_scores(scores)
    pooled = x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
    return _scalar(sps.trim_mean(pooled, IQM_TRIM, axis=-1))


def optimality_gap(scores, gamma: float = 1.0):
    """γ − mean(min(score, γ)) over all (run, task) scores (lower is better)."""
    if not np.isfinite(gamma):
        raise ValueError(f"gamma must be finite, got {gamma!r}")
    x = _as_scores(scores)
    return _scalar(gamma - np.minimum(x, gamma).mean(axis=(-2, -1)))


AGGREGATES: dict[str, Callable] = {"mean": mean, "median": median, "iqm": iqm, "optimality_gap": optimality_gap}


# ---------------------------------------------------------------------------------------------------------
# Stratified bootstrap


@dataclass(frozen=True)
class AggregateEstimate:
    """Point estimate (the statistic of the observed scores) with its stratified-bootstrap percentile CI.

    point/low/high are floats for a scalar statistic, arrays for a vector-valued one.
    """

    point: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    n_runs: int
    n_tasks: int
    ci: float
    n_resamples: int


def stratified_resample_indices(n_runs: int, n_tasks: int, n_resamples: int = N_RESAMPLES,
                                rng=0) -> np.ndarray:
    """Run indices (n_resamples, n_runs, n_tasks), drawn with replacement independently for every task.

    Entry [b, i, m] is the run whose task-m score fills row i of column m in resample b. Drawn in blocks of
    `RESAMPLE_BLOCK` resamples exactly as the bootstrap functions draw them.
    """
    _check_settings(n_resamples, CI)
    gen = _generator(rng)
    return np.concatenate(list(_index_blocks(n_runs, n_tasks, n_resamples, gen)), axis=0)


def _index_blocks(n_runs: int, n_tasks: int, n_resamples: int, gen: np.random.Generator):
    if n_runs < 1 or n_tasks < 1:
        raise ValueError(f"need at least one run and one task to resample, got {n_runs} x {n_tasks}")
    for start in range(0, n_resamples, RESAMPLE_BLOCK):
        size = min(RESAMPLE_BLOCK, n_resamples - start)
        yield gen.integers(0, n_runs, size=(size, n_runs, n_tasks))


def _sub_blocks(n: int, per_item: int):
    """Slices of range(n) such that each slice times per_item elements stays under _MAX_ELEMENTS."""
    step = max(1, _MAX_ELEMENTS // max(1, per_item))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _gather(scores: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Resampled matrices (B, N, M): [b, i, m] = scores[indices[b, i, m], m] (each column from its own task)."""
    return scores[indices, np.arange(scores.shape[1])]


def _apply(aggregate_fn: Callable, block: np.ndarray, point_shape: tuple, batched: bool) -> np.ndarray:
    if not batched:
        return np.stack([np.asarray(aggregate_fn(m), dtype=np.float64) for m in block])
    out = np.asarray(aggregate_fn(block), dtype=np.float64)
    if out.shape != (block.shape[0], *point_shape):
        raise ValueError(f"aggregate_fn returned shape {out.shape} for a stack of {block.shape[0]} resampled "
                         f"matrices {block.shape}; expected {(block.shape[0], *point_shape)}. It must reduce "
                         "only the last two axes (runs, tasks); pass batched=False for a function of one "
                         "(runs x tasks) matrix")
    return out


def stratified_bootstrap(scores, aggregate_fn: Callable = iqm, n_resamples: int = N_RESAMPLES, rng=0,
                         batched: bool = True) -> np.ndarray:
    """Bootstrap distribution (n_resamples, *statistic shape) of aggregate_fn over stratified resamples.

    `aggregate_fn(x)` maps a (runs, tasks) matrix to a scalar or a vector. With batched=True (the built-in
    aggregates) it must also map a stack (B, runs, tasks) to (B, ...); with batched=False it is called once
    per resample.
    """
    x = _as_matrix(scores)
    _check_settings(n_resamples, CI)
    point_shape = np.shape(aggregate_fn(x))
    n, m = x.shape
    parts = []
    for indices in _index_blocks(n, m, n_resamples, _generator(rng)):
        for part in _sub_blocks(indices.shape[0], n * m):
            parts.append(_apply(aggregate_fn, _gather(x, indices[part]), point_shape, batched))
    return np.concatenate(parts, axis=0)


def _estimate(point, boot: np.ndarray, ci: float, shape: tuple, n_resamples: int) -> AggregateEstimate:
    low, high = percentile_interval(boot, ci)
    return AggregateEstimate(_scalar(point), _scalar(low), _scalar(high), int(shape[0]), int(shape[1]),
                             float(ci), int(n_resamples))


def method_generators(rng, names) -> dict[str, np.random.Generator]:
    """One generator per method name, from (seed, name): what the functions of a dict of methods use.

    An integer seed is used as is (with `aggregate.group_generator(seed, (name,))`); a Generator gives one
    draw that serves as that seed. A method's generator does not depend on the other names.
    """
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        base = int(rng)
    else:
        base = int(_generator(rng).integers(0, np.iinfo(np.int64).max))
    return {name: group_generator(base, (name,)) for name in names}


def stratified_bootstrap_ci(score_dict: Mapping, aggregate_fn: Callable = iqm,
                            n_resamples: int = N_RESAMPLES, ci: float = CI, rng=0,
                            batched: bool = True) -> dict[str, AggregateEstimate]:
    """Per method: aggregate_fn of its (runs x tasks) matrix with a stratified-bootstrap percentile CI."""
    scores = _as_score_dict(score_dict)
    _check_settings(n_resamples, ci)
    gens = method_generators(rng, scores)
    out = {}
    for name, x in scores.items():
        boot = stratified_bootstrap(x, aggregate_fn, n_resamples, gens[name], batched)
        out[name] = _estimate(aggregate_fn(x), boot, ci, x.shape, n_resamples)
    return out


# ---------------------------------------------------------------------------------------------------------
# Probability of improvement


def _per_task_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X_m > Y_m) for stacks x (..., N, M), y (..., K, M): Mann–Whitney U_m / (N K) from mid-ranks."""
    n, k = x.shape[-2], y.shape[-2]
    ranks = sps.rankdata(np.concatenate([x, y], axis=-2), method="average", axis=-2)
    u = ranks[..., :n, :].sum(axis=-2) - n * (n + 1) / 2.0
    return u / (n * k)


def probability_of_improvement(x, y) -> float:
    """P(X > Y): the average over tasks of P(X_m > Y_m) + ½ P(X_m = Y_m) between the runs of X and Y."""
    x, y = _as_matrix(x, "x"), _as_matrix(y, "y")
    _check_same_tasks(x, y)
    return float(_per_task_improvement(x, y).mean())


def _check_same_tasks(x: np.ndarray, y: np.ndarray) -> None:
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must cover the same tasks (columns): {x.shape[1]} vs {y.shape[1]}")


def _improvement_boot(x: np.ndarray, y: np.ndarray, x_indices: np.ndarray, y_indices: np.ndarray) -> np.ndarray:
    per_item = (x.shape[0] + y.shape[0]) * x.shape[1] * 4
    parts = []
    for part in _sub_blocks(x_indices.shape[0], per_item):
        parts.append(_per_task_improvement(_gather(x, x_indices[part]), _gather(y, y_indices[part])).mean(axis=-1))
    return np.concatenate(parts)


def probability_of_improvement_ci(x, y, n_resamples: int = N_RESAMPLES, ci: float = CI,
                                  rng=0) -> AggregateEstimate:
    """P(X > Y) with a percentile CI; X's and Y's runs are resampled independently within each task.

    Per block of resamples, X's indices are drawn first, then Y's, from one generator. n_runs is X's.
    """
    x, y = _as_matrix(x, "x"), _as_matrix(y, "y")
    _check_same_tasks(x, y)
    _check_settings(n_resamples, ci)
    gen = _generator(rng)
    x_blocks = _index_blocks(x.shape[0], x.shape[1], n_resamples, gen)
    parts = []
    for x_idx in x_blocks:
        y_idx = gen.integers(0, y.shape[0], size=(x_idx.shape[0], *y.shape))
        parts.append(_improvement_boot(x, y, x_idx, y_idx))
    boot = np.concatenate(parts)
    return _estimate(probability_of_improvement(x, y), boot, ci, x.shape, n_resamples)


@dataclass(frozen=True)
class ImprovementMatrix:
    """point[i, j] = P(methods[i] > methods[j]) with percentile CI [low[i, j], high[i, j]].

    The diagonal is 0.5 with a NaN interval. point[i, j] + point[j, i] = 1, and the interval of (j, i) is
    1 − the interval of (i, j) (both come from the same resamples).
    """

    methods: tuple[str, ...]
    point: np.ndarray
    low: np.ndarray
    high: np.ndarray
    ci: float
    n_resamples: int

    def frame(self) -> pd.DataFrame:
        """Long format, one row per ordered pair of distinct methods: method_x, method_y, probability,
        ci_low, ci_high, ci, n_resamples."""
        rows = [{"method_x": a, "method_y": b, "probability": float(self.point[i, j]),
                 "ci_low": float(self.low[i, j]), "ci_high": float(self.high[i, j]), "ci": self.ci,
                 "n_resamples": self.n_resamples}
                for (i, a), (j, b) in itertools.product(enumerate(self.methods), repeat=2) if i != j]
        return pd.DataFrame(rows, columns=["method_x", "method_y", "probability", "ci_low", "ci_high", "ci",
                                           "n_resamples"])


def probability_of_improvement_matrix(score_dict: Mapping, n_resamples: int = N_RESAMPLES,
                                      ci: float = CI, rng=0) -> ImprovementMatrix:
    """P(X > Y) with stratified-bootstrap CIs for every ordered pair of methods (methods in the dict's order).

    Each method's runs are resampled once, from its own generator (the same resamples as
    `stratified_bootstrap_ci` with the same rng), and every pair uses those resamples.
    """
    scores = _as_score_dict(score_dict)
    _check_settings(n_resamples, ci)
    names = tuple(scores)
    k = len(names)
    gens = method_generators(rng, names)
    blocks = {name: _index_blocks(*scores[name].shape, n_resamples, gens[name]) for name in names}
    pairs = list(itertools.combinations(range(k), 2))
    boot = {pair: [] for pair in pairs}
    for _ in range(0, n_resamples, RESAMPLE_BLOCK):
        indices = {name: next(blocks[name]) for name in names}
        for i, j in pairs:
            a, b = names[i], names[j]
            boot[(i, j)].append(_improvement_boot(scores[a], scores[b], indices[a], indices[b]))
    point = np.full((k, k), 0.5)
    low = np.full((k, k), np.nan)
    high = np.full((k, k), np.nan)
    for i, j in pairs:
        p = probability_of_improvement(scores[names[i]], scores[names[j]])
        lo, hi = percentile_interval(np.concatenate(boot[(i, j)]), ci)
        point[i, j], low[i, j], high[i, j] = p, lo, hi
        point[j, i], low[j, i], high[j, i] = 1.0 - p, 1.0 - hi, 1.0 - lo
    return ImprovementMatrix(names, point, low, high, float(ci), int(n_resamples))


# ---------------------------------------------------------------------------------------------------------
# Performance profiles


@dataclass(frozen=True)
class Profile:
    """A performance profile: point[t] = F(taus[t]) with a pointwise percentile band [low[t], high[t]]."""

    kind: str
    taus: np.ndarray
    point: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_runs: int
    n_tasks: int
    ci: float
    n_resamples: int


def _as_taus(taus) -> np.ndarray:
    t = np.atleast_1d(np.asarray(taus, dtype=np.float64))
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)):
        raise ValueError(f"taus must be a non-empty one-dimensional array of finite thresholds, got {taus!r}")
    return t


def run_score_distribution(scores, taus) -> np.ndarray:
    """F(τ) = fraction of (run, task) scores strictly above τ, for each τ."""
    x, t = _as_matrix(scores), _as_taus(taus)
    return (x.reshape(-1, 1) > t).mean(axis=0)


def average_score_distribution(scores, taus) -> np.ndarray:
    """F(τ) = fraction of tasks whose mean score over runs is strictly above τ, for each τ."""
    x, t = _as_matrix(scores), _as_taus(taus)
    return (x.mean(axis=0)[:, None] > t).mean(axis=0)


def _resample_counts(indices: np.ndarray, n_runs: int) -> np.ndarray:
    """How often each run is drawn per (resample, task): (B, N, M) indices -> (B, M, N) counts."""
    b, _, m = indices.shape
    cell = (np.arange(b)[:, None, None] * m + np.arange(m)[None, None, :]) * n_runs + indices
    return np.bincount(cell.ravel(), minlength=b * m * n_runs).reshape(b, m, n_runs).astype(np.float64)


def _profile_boot(x: np.ndarray, t: np.ndarray, kind: str, indices: np.ndarray) -> np.ndarray:
    n, m = x.shape
    if kind == "run":
        above = (x.T[:, :, None] > t).reshape(m * n, t.size).astype(np.float64)   # rows in (task, run) order
        parts = [_resample_counts(indices[s], n).reshape(-1, m * n) @ above / (n * m)
                 for s in _sub_blocks(indices.shape[0], n * m + t.size)]
    else:
        parts = [((_gather(x, indices[s]).mean(axis=1)[:, :, None] > t).mean(axis=1))
                 for s in _sub_blocks(indices.shape[0], n * m + m * t.size)]
    return np.concatenate(parts, axis=0)


def performance_profile(scores, taus, kind: str = "run", n_resamples: int = N_RESAMPLES,
                        ci: float = CI, rng=0) -> Profile:
    """Score distribution F(τ) of one method with a stratified-bootstrap percentile band at each τ.

    kind="run": the run-score distribution (fraction of (run, task) scores > τ, the paper's default);
    kind="average": the average-score distribution (fraction of tasks with mean score > τ).
    """
    if kind not in PROFILE_KINDS:
        raise ValueError(f"kind must be one of {PROFILE_KINDS}, got {kind!r}")
    x, t = _as_matrix(scores), _as_taus(taus)
    _check_settings(n_resamples, ci)
    point = run_score_distribution(x, t) if kind == "run" else average_score_distribution(x, t)
    boot = np.concatenate([_profile_boot(x, t, kind, idx)
                           for idx in _index_blocks(*x.shape, n_resamples, _generator(rng))], axis=0)
    low, high = percentile_interval(boot, ci)
    return Profile(kind, t, point, np.asarray(low), np.asarray(high), int(x.shape[0]), int(x.shape[1]),
                   float(ci), int(n_resamples))


def performance_profiles(score_dict: Mapping, taus, kind: str = "run", n_resamples: int = N_RESAMPLES,
                         ci: float = CI, rng=0) -> dict[str, Profile]:
    """`performance_profile` for every method, each with its own generator (see the module docstring)."""
    scores = _as_score_dict(score_dict)
    gens = method_generators(rng, scores)
    return {name: performance_profile(x, taus, kind, n_resamples, ci, gens[name]) for name, x in scores.items()}


# ---------------------------------------------------------------------------------------------------------
# The project's per-rule table -> score matrices

PER_RULE_REQUIRED = ["split", "agent", "L", "H", "seed", "side", "rule", "metric", "value"]


class ScoreMatrices(dict):
    """{agent: (seeds x rules) score matrix}, with the labels of rows and columns.

    rules: the shared column order (ascending rule numbers); seeds[agent]: that agent's row order
    (ascending); types: {rule: operational type} when the table has a type column; selection: the
    (metric, side, split, L, H) the matrices were taken from.
    """

    def __init__(self, matrices: dict, rules: np.ndarray, seeds: dict, types: dict, selection: dict):
        super().__init__(matrices)
        self.rules = rules
        self.seeds = seeds
        self.types = types
        self.selection = selection


def _select_one(frame: pd.DataFrame, column: str, wanted, what: str) -> tuple[pd.DataFrame, object]:
    present = sorted(frame[column].dropna().unique().tolist())
    if wanted is None:
        if len(present) > 1:
            raise ValueError(f"the per-rule rows for {what} hold several values of {column!r}: {present}; "
                             f"pass {column}=... to choose one")
        return frame, present[0]
    if wanted not in present:
        raise ValueError(f"no per-rule rows with {column}={wanted!r} for {what}; present: {present}")
    return frame[frame[column] == wanted], wanted


def score_matrices(per_rule_frame: pd.DataFrame, metric: str = "success", side: str = "test",
                   split: str | None = None, H: int | None = None, L: int | None = None,
                   agents=None) -> ScoreMatrices:
    """Score matrices for rliable statistics from a per-rule table (`tapebench aggregate-seed --per-rule-out`).

    Tasks are rules, runs are seeds: returns {agent: array (seeds, rules)} holding the per-rule value of
    `metric` on `side`. split, H and L may be left None when the table holds a single value of each
    (after selecting metric and side); otherwise they must be given. `agents` restricts and orders the
    agents (default: all, sorted). Every agent must have the same rule set, and each of its seeds a value
    for every rule; seeds may differ between agents. Raises ValueError naming what is missing or unmatched.
    """
    if not isinstance(per_rule_frame, pd.DataFrame):
        raise ValueError(f"per_rule_frame must be a pandas DataFrame, got {type(per_rule_frame).__name__}")
    missing = [c for c in PER_RULE_REQUIRED if c not in per_rule_frame.columns]
    if missing:
        raise ValueError(f"per-rule table lacks columns {missing}; expected at least {PER_RULE_REQUIRED} "
                         "(written by `tapebench aggregate-seed --per-rule-out`)")
    frame = per_rule_frame
    if frame.empty:
        raise ValueError("per-rule table is empty")
    for column, wanted in (("metric", metric), ("side", side)):
        present = sorted(frame[column].dropna().astype(str).unique().tolist())
        if wanted not in present:
            raise ValueError(f"per-rule table has no rows with {column}={wanted!r}; present: {present}")
        frame = frame[frame[column] == wanted]
    what = f"metric={metric!r}, side={side!r}"
    frame, split = _select_one(frame, "split", split, what)
    frame, H = _select_one(frame, "H", H, what)
    frame, L = _select_one(frame, "L", L, what)
    where = f"{what}, split={split!r}, L={L}, H={H}"

    present_agents = sorted(frame["agent"].astype(str).unique().tolist())
    if agents is None:
        agents = present_agents
    else:
        agents = [str(a) for a in agents]
        absent = [a for a in agents if a not in present_agents]
        if absent:
            raise ValueError(f"no per-rule rows for agent(s) {absent} at {where}; present: {present_agents}")
        if len(set(agents)) != len(agents):
            raise ValueError(f"agents listed twice: {agents}")
        frame = frame[frame["agent"].astype(str).isin(agents)]

    keys = ["agent", "seed", "rule"]
    dup = frame.duplicated(keys, keep=False)
    if dup.any():
        first = frame.loc[dup, keys].iloc[0].to_dict()
        raise ValueError(f"{int(dup.sum())} duplicated per-rule rows at {where} (was a file given twice?), "
                         f"e.g. {first}")
    values = frame["value"].to_numpy(np.float64)
    if not np.all(np.isfinite(values)):
        bad = frame.loc[~np.isfinite(values), keys].iloc[0].to_dict()
        raise ValueError(f"per-rule values at {where} contain NaN or infinite values, e.g. {bad}")

    matrices, seeds, rule_sets = {}, {}, {}
    for agent in agents:
        rows = frame[frame["agent"].astype(str) == agent]
        wide = rows.pivot(index="seed", columns="rule", values="value").sort_index().sort_index(axis=1)
        holes = wide.isna()
        if holes.to_numpy().any():
            seed = wide.index[holes.any(axis=1).to_numpy()][0]
            lacking = wide.columns[holes.loc[seed].to_numpy()].tolist()
            raise ValueError(f"agent {agent!r} at {where}: seed {seed} has no value for rule(s) {lacking} "
                             f"that other seeds of {agent!r} have; every seed needs every rule")
        rule_sets[agent] = wide.columns.to_numpy()
        seeds[agent] = wide.index.to_numpy()
        matrices[agent] = wide.to_numpy(np.float64)

    reference = agents[0]
    ref_rules = set(rule_sets[reference].tolist())
    for agent in agents[1:]:
        rules = set(rule_sets[agent].tolist())
        if rules != ref_rules:
            raise ValueError(f"agents do not share one rule set at {where}: {agent!r} lacks rules "
                             f"{sorted(ref_rules - rules)} that {reference!r} has, and has rules "
                             f"{sorted(rules - ref_rules)} that {reference!r} lacks")

    types = {}
    if "type" in frame.columns:
        pairs = frame[["rule", "type"]].drop_duplicates()
        types = {int(r): str(t) for r, t in zip(pairs["rule"], pairs["type"])}
    selection = {"metric": metric, "side": side, "split": split, "L": L, "H": H}
    return ScoreMatrices(matrices, rule_sets[reference], seeds, types, selection)


__all__ = ["AGGREGATES", "AggregateEstimate", "ImprovementMatrix", "Profile", "ScoreMatrices",
           "average_score_distribution", "iqm", "mean", "median", "method_generators", "optimality_gap",
           "performance_profile", "performance_profiles", "probability_of_improvement",
           "probability_of_improvement_ci", "probability_of_improvement_matrix", "run_score_distribution",
           "score_matrices", "stratified_bootstrap", "stratified_bootstrap_ci", "stratified_resample_indices"]
