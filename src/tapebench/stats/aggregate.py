"""From per-episode records to per-seed values, to bootstrap summaries over seeds
(docs/protocol.md#schedule, #metrics, #statistics).

Stage 1 — `tapebench aggregate-seed` (`seed_tables`) reads per-episode records (schema in
`tapebench.evaluation.records`, with the agent columns agent, seed, checkpoint) and writes long tables.
The group of a row is (split, agent, L, H, seed, side); side is "train" (ID), "test" (OOD), "rules", or a
severity-ladder level "d1", "d2", ... (OOD at exact rule-table distance d, docs/protocol.md#severity-ladders).

Metrics (`METRICS`), all per-episode values averaged over episodes:
  success                 strict success rate (dist = 0 at episode end)
  soft_success@0.03125, soft_success@0.0625, soft_success@0.1
                          rate of final_dist <= eps
  final_dist, auc_dist    normalised Hamming distance at the end / averaged over the trajectory
  return                  undiscounted shaped return
  steps                   episode length

per_seed.parquet (`--out`), one row per (split, agent, L, H, seed, side, metric):
  split, agent (str); L, H, seed (int); side, metric (str);
  value (float)           the seed's final value: mean over its last K checkpoints of the per-checkpoint
                          mean over episodes (docs/protocol.md#schedule)
  k_used (int)            checkpoints averaged: min(K, checkpoints available)
  checkpoint_first, checkpoint_last (int)   first and last checkpoint (env steps) averaged
  n_episodes (int)        episodes behind `value` (summed over the k_used checkpoints)

curves.parquet (`--curves-out`, learning curves), one row per (split, agent, L, H, seed, side,
checkpoint, metric): the group columns, checkpoint (int), metric, value (mean over that checkpoint's
episodes), n_episodes.

per_rule.parquet (`--per-rule-out`, per-rule / by-type figures), one row per (split, agent, L, H, seed,
side, rule, metric): the group columns, rule (int), type (str), metric, value (mean over the same last
k_used checkpoints and the rule's episodes), k_used, n_episodes.

Stage 2 — `tapebench aggregate` (`aggregate_seeds`) reads per-seed tables and bootstraps over seeds.

aggregate.parquet (`--out`), one row per (split, agent, L, H, side, metric):
  split, agent (str); L, H (int);
  side (str)              "train" (ID), "test" (OOD), "rules", or "drop": the per-seed difference
                          train - test (ID - OOD) of the metric, with a *paired* bootstrap
  metric (str); n (int) seeds; mean (float) mean over seeds; sd (float) sample sd over seeds (ddof 1,
  NaN for n = 1); ci_low, ci_high (float) percentile-bootstrap interval of the mean;
  ci (float) the confidence level; n_resamples (int)
For one (split, agent, L, H) all sides and metrics use the same resampled seed indices, drawn from a
generator seeded by (--seed, split, agent, L, H): adding or removing other agents changes no number.
Rule-agnostic floor (docs/protocol.md#rule-agnostic-floors; when the reference and at least one rule-agnostic
row, registry flag `rule_agnostic`, are among the agents): per (split, L, H) and side "train" / "test" the floor is
the rule-agnostic row with the highest mean strict success; one row of the reference with metric "rule_headroom"
= reference mean - floor mean (CI: both seed sets resampled independently); and per agent other than the
reference one row with side "test", metric "agnostic_score" = 100 (p - p_floor) / (p_ref - p_floor) on OOD strict
success (CI: the agent's, the floor's and the reference's seeds resampled independently, percentiles over the
resamples where the reference exceeds the floor, NaN when those are fewer than `ci` of all; the mean is NaN where
the reference does not exceed the floor). Generators seeded by (--seed, split, agent, L, H, metric, side).
Oracle-normalised score (when the reference method, `mpc` by default, is among the agents): one more row
per other agent with side "test" and metric "on_success" = 100 * (agent's mean OOD strict success) /
(reference's mean OOD strict success) on the same protocol (same split, L, H, episodes); its CI resamples
the agent's seeds and the reference's seeds independently (generator seeded by (--seed, split, agent, L,
H, "on_success", reference)); NaN when the reference never succeeds. n is the agent's number of seeds.

tests.parquet (`--tests-out`), Welch diagnostics between every pair of agents on the OOD ("test") side,
one row per (split, L, H, metric, agent_a, agent_b), agents in sorted order:
  split (str), L, H (int), side (str, "test"), metric (str), agent_a, agent_b (str), n_a, n_b (int),
  mean_a, mean_b, diff (mean_a - mean_b), diff_ci_low, diff_ci_high (independent-groups bootstrap),
  hedges_g, t, df, p (Welch two-sided), p_holm (Holm-adjusted within the family (split, L, H, metric)),
  reject_holm (bool, p_holm < alpha; alpha = 0.05)
Tests are diagnostics only; the effect sizes with CIs are the primary evidence (paper App. K.3).

All Parquet files carry the provenance record (config slice, seed, code version, inputs) in their schema
metadata under the key "tapebench".
"""
from __future__ import annotations

import itertools
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from tapebench import defaults
from tapebench.defaults import CI, N_RESAMPLES, REFERENCE
from tapebench.evaluation.records import SOFT_EPSILONS, coerce_episode_frame, soft_success
from tapebench.registry import registry
from tapebench.schemas import AGGREGATE_COLUMNS, GROUP, PER_SEED_COLUMNS, RULE_SUM_COLUMNS, SUMMARY_GROUP
from tapebench.stats.bootstrap import difference_ci, hedges_g, holm, percentile_interval, resample_indices, welch_test
from tapebench.stats.headroom import best_floor, headroom_ci, normalised_score_ci
from tapebench.utils import artifacts
from tapebench.validation import refuse_duplicates
from tapebench.vocabulary import DROP_SIDE, ID_SIDE, OOD_SIDE, ladder_level

SOFT_METRICS = tuple(f"soft_success@{eps:g}" for eps in SOFT_EPSILONS)
METRICS = ("success", *SOFT_METRICS, "final_dist", "auc_dist", "return", "steps")
TEST_ALPHA = 0.05
ON_METRIC = "on_success"       # oracle-normalised OOD strict success, ON(p) = 100 p / p_reference
HEADROOM_METRIC = "rule_headroom"   # reference success minus the best rule-agnostic row's, ID and OOD
SCORE_METRIC = "agnostic_score"     # OOD success on the scale rule-agnostic floor = 0, reference = 100



TABLE_KINDS = {"episode": "episodes", "per-seed": "per_seed"}   # `what` -> utils.artifacts table kind


def read_tables(paths, what: str) -> pd.DataFrame:
    """Concatenate Parquet files of one kind ("episode" or "per-seed"), naming any that is missing,
    damaged, edited, of another kind, or given twice (`utils.artifacts.read_tables`)."""

    paths = refuse_duplicates(paths, what)
    if not paths:
        raise ValueError(f"no {what} files given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{what} file(s) not found: {', '.join(missing)}")
    return pd.concat([frame for frame, _ in artifacts.read_tables(paths, TABLE_KINDS[what], what)], ignore_index=True)


def _metric_frame(episodes: pd.DataFrame) -> pd.DataFrame:
    """Per-episode metric columns (floats) beside the keys."""
    out = episodes[[*GROUP, "checkpoint", "rule", "type", "episode"]].copy()
    out["success"] = episodes["success"].astype(np.float64)
    for name, eps in zip(SOFT_METRICS, SOFT_EPSILONS):
        out[name] = soft_success(episodes["final_dist"].to_numpy(np.float64), eps).astype(np.float64)
    for name in ("final_dist", "auc_dist", "return", "steps"):
        out[name] = episodes[name].astype(np.float64)
    bad = [m for m in METRICS if not np.isfinite(out[m].to_numpy()).all()]
    if bad:
        raise ValueError(f"episode records contain NaN or infinite values in {bad}")
    return out


def _check_episode_keys(frame: pd.DataFrame) -> None:
    dup = frame.duplicated([*GROUP, "checkpoint", "rule", "episode"], keep=False)
    if dup.any():
        first = frame.loc[dup, [*GROUP, "checkpoint", "rule", "episode"]].iloc[0].to_dict()
        raise ValueError(f"{int(dup.sum())} duplicated episode records (was a file given twice?), e.g. {first}")


def _check_matched_checkpoints(curves: pd.DataFrame) -> None:
    """ID and OOD of one seed must be evaluated at the same checkpoints, or the drop compares apples and pears."""
    sides = curves[curves["side"].isin([ID_SIDE, OOD_SIDE])]
    for key, grp in sides.groupby(GROUP[:-1], sort=True):
        by_side = {s: set(g["checkpoint"]) for s, g in grp.groupby("side")}
        if len(by_side) == 2 and by_side[ID_SIDE] != by_side[OOD_SIDE]:
            only_id = sorted(by_side[ID_SIDE] - by_side[OOD_SIDE])
            only_ood = sorted(by_side[OOD_SIDE] - by_side[ID_SIDE])
            raise ValueError(f"{dict(zip(GROUP[:-1], key))}: ID and OOD were evaluated at different checkpoints "
                             f"(only ID: {only_id}; only OOD: {only_ood})")


def rule_sums(episodes: pd.DataFrame) -> pd.DataFrame:
    """Per-episode records -> one row per (split, agent, L, H, seed, side, checkpoint, rule): the rule's type,
    its episode count and the sum of each metric over those episodes (`schemas.RULE_SUM_COLUMNS`). Every
    per-seed value, curve and per-rule value is a ratio of these sums, so a shipped reference set holds them
    instead of the episodes (docs/protocol.md#reference-sets)."""
    episodes = coerce_episode_frame(episodes, with_agent=True)
    if episodes.empty:
        raise ValueError("episode table is empty")
    frame = _metric_frame(episodes)
    _check_episode_keys(frame)
    by_rule = frame.groupby([*GROUP, "checkpoint", "rule", "type"], sort=True)
    sums = by_rule[list(METRICS)].sum()
    sums.insert(0, "n_episodes", by_rule.size())
    return sums.reset_index()[list(RULE_SUM_COLUMNS)]


def coerce_rule_sums(sums: pd.DataFrame) -> pd.DataFrame:
    """Check a rule-sums table: its columns, unique keys, positive counts and finite sums."""
    missing = [c for c in RULE_SUM_COLUMNS if c not in sums.columns]
    if missing:
        raise ValueError(f"rule-sums table lacks columns {missing}; expected {list(RULE_SUM_COLUMNS)}")
    sums = sums[list(RULE_SUM_COLUMNS)].astype(RULE_SUM_COLUMNS)
    if sums.empty:
        raise ValueError("rule-sums table is empty")
    keys = [*GROUP, "checkpoint", "rule"]
    dup = sums.duplicated(keys, keep=False)
    if dup.any():
        first = sums.loc[dup, keys].iloc[0].to_dict()
        raise ValueError(f"{int(dup.sum())} duplicated rule-sums rows (was a file given twice?), e.g. {first}")
    if (sums["n_episodes"] < 1).any():
        raise ValueError("rule-sums table has rows with n_episodes < 1")
    bad = [m for m in METRICS if not np.isfinite(sums[m].to_numpy()).all()]
    if bad:
        raise ValueError(f"rule-sums table contains NaN or infinite sums in {bad}")
    return sums


def _means(sums: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys`: each metric's sum over the group's rows divided by its episodes."""
    grouped = sums.groupby(keys, sort=True)
    totals = grouped[["n_episodes", *METRICS]].sum()
    means = totals[list(METRICS)].div(totals["n_episodes"].astype(np.float64), axis=0)
    means["n_episodes"] = totals["n_episodes"]
    return means.reset_index()


def seed_tables(episodes: pd.DataFrame, last_k: int = defaults.LAST_K) -> dict[str, pd.DataFrame]:
    """Per-seed values, learning curves and per-rule values (schemas in the module docstring)."""
    return seed_tables_from_sums(rule_sums(episodes), last_k=last_k)


def seed_tables_from_sums(sums: pd.DataFrame, last_k: int = defaults.LAST_K) -> dict[str, pd.DataFrame]:
    """`seed_tables` from rule sums (`rule_sums`): the same tables, bit for bit, whether the sums come from this
    run's episodes or from a reference set."""
    if not isinstance(last_k, (int, np.integer)) or isinstance(last_k, bool) or last_k < 1:
        raise ValueError(f"last_k must be a positive integer (paper: 3), got {last_k!r}")
    sums = coerce_rule_sums(sums)
    wide_curves = _means(sums, [*GROUP, "checkpoint"])
    _check_matched_checkpoints(wide_curves)

    # rank checkpoints from the last one: 0 = last; keep ranks < K
    wide_curves["from_last"] = wide_curves.groupby(GROUP)["checkpoint"].rank(ascending=False, method="first") - 1
    last = wide_curves[wide_curves["from_last"] < last_k]
    by_seed = last.groupby(GROUP, sort=True)
    wide_seed = by_seed[list(METRICS)].mean()
    wide_seed["k_used"] = by_seed.size()
    wide_seed["checkpoint_first"] = by_seed["checkpoint"].min()
    wide_seed["checkpoint_last"] = by_seed["checkpoint"].max()
    wide_seed["n_episodes"] = by_seed["n_episodes"].sum()
    wide_seed = wide_seed.reset_index()

    per_seed = wide_seed.melt(id_vars=[*GROUP, "k_used", "checkpoint_first", "checkpoint_last", "n_episodes"],
                              value_vars=list(METRICS), var_name="metric", value_name="value")
    per_seed = _sorted(per_seed[PER_SEED_COLUMNS], [*GROUP, "metric"])

    curves = wide_curves.melt(id_vars=[*GROUP, "checkpoint", "n_episodes"], value_vars=list(METRICS),
                              var_name="metric", value_name="value")
    curves = _sorted(curves[[*GROUP, "checkpoint", "metric", "value", "n_episodes"]],
                     [*GROUP, "checkpoint", "metric"])

    per_rule = _per_rule(sums, last[[*GROUP, "checkpoint"]], wide_seed[[*GROUP, "k_used"]])
    return {"per_seed": per_seed, "curves": curves, "per_rule": per_rule}


def _per_rule(sums: pd.DataFrame, used_checkpoints: pd.DataFrame, k_used: pd.DataFrame) -> pd.DataFrame:
    used = sums.merge(used_checkpoints, on=[*GROUP, "checkpoint"], how="inner")
    per_ckpt = _means(used, [*GROUP, "rule", "type", "checkpoint"])
    by_rule = per_ckpt.groupby([*GROUP, "rule", "type"], sort=True)
    wide = by_rule[list(METRICS)].mean()
    wide["n_episodes"] = by_rule["n_episodes"].sum()
    wide = wide.reset_index().merge(k_used, on=GROUP, how="left")
    long = wide.melt(id_vars=[*GROUP, "rule", "type", "k_used", "n_episodes"], value_vars=list(METRICS),
                     var_name="metric", value_name="value")
    return _sorted(long[[*GROUP, "rule", "type", "metric", "value", "k_used", "n_episodes"]],
                   [*GROUP, "rule", "metric"])


def _metric_rank(column: pd.Series) -> pd.Series:
    """Sort key: metrics in `METRICS` order (unknown ones last), other columns as they are."""
    if column.name != "metric":
        return column
    order = {m: i for i, m in enumerate(METRICS)}
    return column.map(lambda m: order.get(m, len(METRICS)))


def _sorted(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by, key=_metric_rank, kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------
# Stage 2: bootstrap over seeds


def coerce_per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """Check a per-seed table (as written by `seed_tables`)."""
    missing = [c for c in PER_SEED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"per-seed table lacks columns {missing}; expected {PER_SEED_COLUMNS} "
                         "(written by `tapebench aggregate-seed`)")
    df = df[PER_SEED_COLUMNS].astype({"split": "string", "agent": "string", "L": "int64", "H": "int64",
                                      "seed": "int64", "side": "string", "metric": "string",
                                      "value": "float64"})
    if df.empty:
        raise ValueError("per-seed table is empty")
    dup = df.duplicated([*GROUP, "metric"], keep=False)
    if dup.any():
        first = df.loc[dup, [*GROUP, "metric"]].iloc[0].to_dict()
        raise ValueError(f"{int(dup.sum())} duplicated per-seed rows (was a file given twice?), e.g. {first}")
    if not np.isfinite(df["value"].to_numpy()).all():
        raise ValueError("per-seed table contains NaN or infinite values")
    return df


def group_generator(seed: int, key: tuple) -> np.random.Generator:
    """A generator that depends only on the statistics seed and the group key (stable across runs/platforms)."""
    words = [zlib.crc32(repr(tuple(str(k) for k in key)).encode())]
    return np.random.default_rng(np.random.SeedSequence([int(seed), *words]))


def _summaries(values: np.ndarray, indices: np.ndarray, ci: float) -> dict[str, np.ndarray]:
    """values (n seeds, m metrics) -> mean, sd, ci_low, ci_high per metric."""
    n = values.shape[0]
    boot = values[indices].mean(axis=1)
    low, high = percentile_interval(boot, ci)
    sd = values.std(axis=0, ddof=1) if n > 1 else np.full(values.shape[1], np.nan)
    return {"mean": values.mean(axis=0), "sd": sd, "ci_low": low, "ci_high": high}


def aggregate_seeds(per_seed: pd.DataFrame, n_resamples: int = N_RESAMPLES, ci: float = CI,
                    seed: int = 0, reference: str = REFERENCE, rule_agnostic=None) -> pd.DataFrame:
    """Bootstrap summaries per (split, agent, L, H, side, metric), plus the paired ID - OOD drop.
    `rule_agnostic`: the ids of the rule-agnostic rows (None: the registry's `rule_agnostic` methods)."""
    if not 0.0 < ci < 1.0:
        raise ValueError(f"--ci must be in (0, 1), e.g. 0.95; got {ci!r}")
    if n_resamples < 1:
        raise ValueError(f"--n-resamples must be a positive integer, got {n_resamples!r}")
    per_seed = coerce_per_seed(per_seed)
    rows = []
    for key, grp in per_seed.groupby(SUMMARY_GROUP, sort=True):
        wide = grp.pivot(index=["side", "seed"], columns="metric", values="value")
        metrics = [m for m in METRICS if m in wide.columns] + sorted(set(wide.columns) - set(METRICS))
        sides = list(dict.fromkeys(grp["side"]))
        incomplete = wide[metrics].isna().any(axis=1)
        if incomplete.any():
            side, s = wide.index[incomplete][0]
            raise ValueError(f"{dict(zip(SUMMARY_GROUP, key))}: seed {s} on side {side!r} lacks some metrics")
        seeds_by_side = {side: wide.loc[side].index.to_numpy() for side in sides}
        _check_paired_seeds(key, seeds_by_side)
        generator_cache: dict[tuple, np.ndarray] = {}

        def indices_for(seeds: np.ndarray) -> np.ndarray:
            if tuple(seeds) not in generator_cache:
                gen = group_generator(seed, (*key, tuple(seeds.tolist())))
                generator_cache[tuple(seeds)] = resample_indices(len(seeds), n_resamples, gen)
            return generator_cache[tuple(seeds)]

        side_values = {side: wide.loc[side][metrics].to_numpy(np.float64) for side in sides}
        if ID_SIDE in side_values and OOD_SIDE in side_values:
            side_values[DROP_SIDE] = side_values[ID_SIDE] - side_values[OOD_SIDE]
            seeds_by_side[DROP_SIDE] = seeds_by_side[ID_SIDE]
        for side in _side_order(side_values):
            values = side_values[side]
            summary = _summaries(values, indices_for(seeds_by_side[side]), ci)
            for j, metric in enumerate(metrics):
                rows.append({**dict(zip(SUMMARY_GROUP, key)), "side": side, "metric": metric,
                             "n": values.shape[0], **{k: float(v[j]) for k, v in summary.items()},
                             "ci": float(ci), "n_resamples": int(n_resamples)})
    out = pd.DataFrame(rows, columns=AGGREGATE_COLUMNS)
    for extra in (oracle_normalized(per_seed, reference, n_resamples, ci, seed),
                  floor_normalized(per_seed, rule_agnostic, reference, n_resamples, ci, seed)):
        if not extra.empty:
            out = pd.concat([out, extra], ignore_index=True)
    return out.astype({"L": "int64", "H": "int64", "n": "int64", "n_resamples": "int64"})


def oracle_normalized(per_seed: pd.DataFrame, reference: str = REFERENCE,
                      n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0) -> pd.DataFrame:
    """ON(p) = 100 p / p_reference on OOD strict success per (split, agent, L, H), with a bootstrap CI."""
    data = per_seed[(per_seed["side"] == OOD_SIDE) & (per_seed["metric"] == "success")]
    rows = []
    for (split, L, H), grp in data.groupby(["split", "L", "H"], sort=True):
        samples = {a: g.sort_values("seed")["value"].to_numpy(np.float64) for a, g in grp.groupby("agent", sort=True)}
        if reference not in samples:
            continue
        ref = samples[reference]
        for agent, values in samples.items():
            if agent == reference:
                continue
            gen = group_generator(seed, (split, agent, L, H, ON_METRIC, reference))
            boot_a = values[resample_indices(len(values), n_resamples, gen)].mean(axis=1)
            boot_r = ref[resample_indices(len(ref), n_resamples, gen)].mean(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                boot = np.where(boot_r > 0, 100.0 * boot_a / np.where(boot_r > 0, boot_r, 1.0), np.nan)
            mean = 100.0 * values.mean() / ref.mean() if ref.mean() > 0 else np.nan
            low, high = (percentile_interval(boot, ci) if np.isfinite(boot).all() else (np.nan, np.nan))
            rows.append({"split": split, "agent": agent, "L": L, "H": H, "side": OOD_SIDE, "metric": ON_METRIC,
                         "n": len(values), "mean": float(mean), "sd": np.nan, "ci_low": float(low),
                         "ci_high": float(high), "ci": float(ci), "n_resamples": int(n_resamples)})
    return pd.DataFrame(rows, columns=AGGREGATE_COLUMNS)


def rule_agnostic_ids() -> tuple[str, ...]:
    """The registry's rule-agnostic rows (flag `rule_agnostic`): the one definition of the floor's candidates."""
    return tuple(m for m, method in registry().items() if method.rule_agnostic)


def floor_normalized(per_seed: pd.DataFrame, rule_agnostic=None, reference: str = REFERENCE,
                     n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0) -> pd.DataFrame:
    """The reference's rule-dependent headroom (ID and OOD) and every agent's floor-normalised OOD score."""
    agnostic = set(rule_agnostic_ids() if rule_agnostic is None else rule_agnostic)
    data = per_seed[per_seed["metric"] == "success"]
    rows = []

    def row(split, agent, L, H, side, metric, iv):
        return {"split": split, "agent": agent, "L": L, "H": H, "side": side, "metric": metric, "n": iv.n,
                "mean": float(iv.mean), "sd": np.nan, "ci_low": float(iv.low), "ci_high": float(iv.high),
                "ci": float(ci), "n_resamples": int(n_resamples)}

    for (split, L, H), grp in data.groupby(["split", "L", "H"], sort=True):
        for side in (ID_SIDE, OOD_SIDE):
            samples = {a: g.sort_values("seed")["value"].to_numpy(np.float64)
                       for a, g in grp[grp["side"] == side].groupby("agent", sort=True)}
            floors = {a: v for a, v in samples.items() if a in agnostic}
            if reference not in samples or not floors:
                continue
            floor = samples[best_floor(floors)]
            gen = group_generator(seed, (split, reference, L, H, HEADROOM_METRIC, side))
            rows.append(row(split, reference, L, H, side, HEADROOM_METRIC,
                            headroom_ci(samples[reference], floor, paired=False, n_resamples=n_resamples, ci=ci,
                                        rng=gen)))
            if side != OOD_SIDE:
                continue
            for agent, values in samples.items():
                if agent == reference:
                    continue
                gen = group_generator(seed, (split, agent, L, H, SCORE_METRIC, side))
                rows.append(row(split, agent, L, H, side, SCORE_METRIC,
                                normalised_score_ci(values, floor, samples[reference], n_resamples, ci, gen)))
    return pd.DataFrame(rows, columns=AGGREGATE_COLUMNS)


def _side_order(sides) -> list[str]:
    preferred = [ID_SIDE, OOD_SIDE, DROP_SIDE]
    return [s for s in preferred if s in sides] + sorted(s for s in sides if s not in preferred)


def _check_paired_seeds(key, seeds_by_side: dict) -> None:
    """ID pairs with the OOD side(s): 'test', or the levels 'd1', 'd2', ... of a severity ladder."""
    ood_sides = [s for s in seeds_by_side if s == OOD_SIDE or ladder_level(s) is not None]
    has_id, has_ood = ID_SIDE in seeds_by_side, bool(ood_sides)
    where = ", ".join(f"{k}={v}" for k, v in zip(SUMMARY_GROUP, key))
    if has_id != has_ood:
        present, absent = (ID_SIDE, OOD_SIDE) if has_id else (ood_sides[0], ID_SIDE)
        raise ValueError(f"{where}: per-seed values exist for side {present!r} but none for {absent!r}; "
                         "the paired ID-OOD drop needs both sides for every seed")
    if has_id:
        id_seeds = set(seeds_by_side[ID_SIDE].tolist())
        for side in ood_sides:
            ood_seeds = set(seeds_by_side[side].tolist())
            if id_seeds != ood_seeds:
                label = "OOD" if side == OOD_SIDE else side
                raise ValueError(f"{where}: seeds are not matched across ID and {label} (ID only: "
                                 f"{sorted(id_seeds - ood_seeds)}; {label} only: {sorted(ood_seeds - id_seeds)}); "
                                 "the paired ID-OOD drop needs both sides for every seed")


def method_tests(per_seed: pd.DataFrame, n_resamples: int = N_RESAMPLES, ci: float = CI,
                 seed: int = 0, side: str = OOD_SIDE, alpha: float = TEST_ALPHA) -> pd.DataFrame:
    """Pairwise Welch tests with Holm correction and effect sizes between agents (schema in module docstring)."""
    per_seed = coerce_per_seed(per_seed)
    data = per_seed[per_seed["side"] == side]
    columns = ["split", "L", "H", "side", "metric", "agent_a", "agent_b", "n_a", "n_b", "mean_a", "mean_b",
               "diff", "diff_ci_low", "diff_ci_high", "hedges_g", "t", "df", "p", "p_holm", "reject_holm"]
    rows = []
    for key, family in data.groupby(["split", "L", "H", "metric"], sort=True):
        split, L, H, metric = key
        samples = {agent: g.sort_values("seed")["value"].to_numpy()
                   for agent, g in family.groupby("agent", sort=True)}
        family_rows = []
        for a, b in itertools.combinations(sorted(samples), 2):
            xa, xb = samples[a], samples[b]
            diff = difference_ci(xa, xb, n_resamples, ci, group_generator(seed, (split, L, H, metric, a, b)))
            welch = welch_test(xa, xb)
            family_rows.append({"split": split, "L": L, "H": H, "side": side, "metric": metric,
                                "agent_a": a, "agent_b": b, "n_a": xa.size, "n_b": xb.size,
                                "mean_a": float(xa.mean()), "mean_b": float(xb.mean()), "diff": diff.mean,
                                "diff_ci_low": diff.low, "diff_ci_high": diff.high, "hedges_g": hedges_g(xa, xb),
                                "t": welch.statistic, "df": welch.df, "p": welch.p_value})
        adjusted = holm([r["p"] for r in family_rows])
        for r, p_adj in zip(family_rows, adjusted):
            r["p_holm"] = float(p_adj)
            r["reject_holm"] = bool(p_adj < alpha) if not np.isnan(p_adj) else False
        rows.extend(family_rows)
    out = pd.DataFrame(rows, columns=columns)
    if not out.empty:
        out = _sorted(out, ["split", "L", "H", "metric", "agent_a", "agent_b"])
    return out.astype({"L": "int64", "H": "int64", "n_a": "int64", "n_b": "int64", "reject_holm": "bool"})
