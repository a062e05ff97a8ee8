"""Model-error aggregation over seeds, the model-error table and figure, and the sweep summary."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tapebench.report.world_model import render_model_error, render_sweep, sweep_summary
from tapebench.stats.aggregate import PER_SEED_COLUMNS
from tapebench.stats.model_error import (ALL_TYPES, aggregate_errors, aggregate_model_error_files, growth,
                                         per_seed_errors, value)
from tapebench.utils.artifacts import WrongKind
from tapebench.utils.io import write_parquet


def run_table(agent: str, seed: int, errors: dict) -> pd.DataFrame:
    """errors: {(side, rule, type, depth): (error, n)} -> a `tapebench model-error` table."""
    rows = [{"agent": agent, "seed": seed, "checkpoint": 1000, "side": side, "rule": rule, "type": typ,
             "depth": depth, "error": err, "n": n} for (side, rule, typ, depth), (err, n) in errors.items()]
    return pd.DataFrame(rows)


def test_a_seed_value_weights_rules_by_episodes_and_all_pools_types():
    table = run_table("m", 0, {("test", 30, "chaotic", 1): (0.5, 3), ("test", 4, "fixed", 1): (0.1, 1)})
    per_seed = per_seed_errors(table)
    pooled = per_seed[per_seed["type"] == ALL_TYPES]
    assert pooled["error"].item() == pytest.approx((0.5 * 3 + 0.1) / 4)
    assert pooled["episodes"].item() == 4
    assert per_seed.loc[per_seed["type"] == "fixed", "error"].item() == pytest.approx(0.1)


def test_aggregate_is_the_mean_over_seeds_with_a_ci_around_it():
    errs = [0.10, 0.20, 0.30, 0.40]
    table = pd.concat([run_table("m", s, {("train", 30, "chaotic", 1): (e, 5), ("train", 30, "chaotic", 2): (2 * e, 5)})
                       for s, e in enumerate(errs)])
    agg = aggregate_errors(table, n_resamples=500, ci=0.9, seed=1)
    one = value(agg, "m", "train", 1)
    assert one["mean"] == pytest.approx(np.mean(errs)) and one["n"] == 4
    assert min(errs) <= one["low"] <= one["mean"] <= one["high"] <= max(errs)
    assert growth(agg, "m", "train", 2) == pytest.approx(2.0)
    assert value(agg, "m", "test", 1) is None
    # the same inputs give the same table (generators keyed by the group, not by call order)
    assert agg.equals(aggregate_errors(table.iloc[::-1], n_resamples=500, ci=0.9, seed=1))


def _write_runs(tmp_path, agents=("ensemble_mpc", "dreamer"), seeds=3):
    paths = []
    for a, agent in enumerate(agents):
        for s in range(seeds):
            errors = {(side, rule, typ, d): (0.05 * (a + 1) * d + 0.01 * s + (0.02 if side == "test" else 0), 4)
                      for side in ("train", "test") for rule, typ in ((30, "chaotic"), (4, "fixed"))
                      for d in range(1, 5)}
            path = tmp_path / f"{agent}{s}.parquet"
            write_parquet(path, run_table(agent, s, errors),
                          meta={"table": "model_error", "model_error": {"context": 4, "depth": 4, "H": 32}})
            paths.append(path)
    return paths


def _aggregate_table(agents, H=32):
    rows = []
    for agent in agents:
        for side, mean in (("train", 0.6), ("test", 0.3)):
            rows.append({"split": "main", "agent": agent, "L": 32, "H": H, "side": side, "metric": "success", "n": 3,
                         "mean": mean, "sd": 0.1, "ci_low": mean - 0.05, "ci_high": mean + 0.05, "ci": 0.95,
                         "n_resamples": 100})
    return pd.DataFrame(rows)


def test_model_error_table_and_figure(tmp_path):
    paths = _write_runs(tmp_path)
    out = tmp_path / "agg.parquet"
    table = aggregate_model_error_files(paths, out, n_resamples=200, ci=0.95, seed=0)
    assert set(table["agent"]) == {"ensemble_mpc", "dreamer"}
    agg_path = tmp_path / "aggregate.parquet"
    write_parquet(agg_path, _aggregate_table(["ensemble_mpc", "dreamer"]), meta={"table": "aggregate"})
    tex = render_model_error(tmp_path / "me.tex", model_error=out, aggregate=agg_path, split="main", H=32, depth=4,
                             figure=tmp_path / "fig")
    one_step_id = value(table, "ensemble_mpc", "train", 1)["mean"]
    assert f"{one_step_id:.3f}" in tex and "0.600" in tex and "0.300" in tex
    growth_id = growth(table, "dreamer", "train", 4)
    assert f"{growth_id:.1f}$\\times$" in tex
    assert (tmp_path / "fig.pdf").stat().st_size > 1000 and (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="beyond the measured depths"):
        render_model_error(tmp_path / "x.tex", model_error=out, split="main", H=32, depth=9)


def test_pooling_probes_measured_differently_is_refused(tmp_path):
    paths = _write_runs(tmp_path, agents=("dreamer",), seeds=2)
    write_parquet(paths[1], pd.read_parquet(paths[1]),
                  meta={"table": "model_error", "model_error": {"context": 2, "depth": 4, "H": 32}})
    with pytest.raises(ValueError, match="different probes"):
        aggregate_model_error_files(paths, tmp_path / "agg.parquet", n_resamples=10, ci=0.9, seed=0)


def test_a_wrong_table_is_named(tmp_path):
    path = tmp_path / "agg.parquet"
    write_parquet(path, _aggregate_table(["dqn"]), meta={"table": "aggregate"})
    with pytest.raises(WrongKind, match="tapebench aggregate-model-error"):
        render_model_error(tmp_path / "x.tex", model_error=path, split="main", H=32)


def _per_seed(path, successes: dict, H=32):
    rows = []
    for side, values in successes.items():
        for seed, v in enumerate(values):
            rows.append({"split": "main", "agent": "dreamer", "L": 32, "H": H, "seed": seed, "side": side,
                         "metric": "success", "value": v, "k_used": 3, "checkpoint_first": 1,
                         "checkpoint_last": 3, "n_episodes": 10})
    write_parquet(path, pd.DataFrame(rows, columns=PER_SEED_COLUMNS), meta={"table": "per_seed"})


def test_sweep_summary_pairs_each_value_with_its_tables(tmp_path):
    per_seed, errors = [], []
    for v, base in ((5, 0.2), (10, 0.4)):
        p = tmp_path / f"{v}.per_seed.parquet"
        _per_seed(p, {"train": [base, base + 0.1], "test": [base / 2, base / 2]})
        per_seed.append(p)
        (tmp_path / f"v{v}").mkdir()
        runs = _write_runs(tmp_path / f"v{v}", agents=("dreamer",), seeds=2)
        e = tmp_path / f"{v}.model_error.parquet"
        aggregate_model_error_files(runs, e, n_resamples=50, ci=0.9, seed=0)
        errors.append(e)
    summary = sweep_summary([5, 10], per_seed, errors, method="dreamer", hyperparameter="imagination_horizon", H=32,
                            n_resamples=100)
    s10 = summary[(summary["value"] == 10) & (summary["side"] == "train")].iloc[0]
    assert s10["success"] == pytest.approx(0.45) and s10["n_seeds"] == 2
    assert summary[(summary["value"] == 5) & (summary["side"] == "test")]["success"].item() == pytest.approx(0.1)
    tex = render_sweep(tmp_path / "sweep.tex", method="dreamer", hyperparameter="imagination_horizon",
                       values=[5, 10], per_seed=per_seed, model_error=errors, H=32, split="main",
                       parquet=tmp_path / "s.parquet", figure=tmp_path / "sweep", n_resamples=100)
    assert "imagination horizon" in tex and "0.450" in tex
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="one per-seed table and one model-error table per value"):
        sweep_summary([5, 10, 15], per_seed, errors, method="dreamer", hyperparameter="h", H=32)
