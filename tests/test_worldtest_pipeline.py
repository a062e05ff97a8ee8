"""The world test in the pipeline (docs/protocol.md#world-test): aggregation against a hand computation, config
validation, the tiny DAG's table, figure and per-job files, and precise reruns (a new budget schedules only its
jobs, the aggregate, the table and the figure)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from pipeline_helpers import REPO, copy_workdir, scheduled_jobs, snakemake

from tapebench.pipeline.config import ConfigError, load_config, validate_config
from tapebench.report.worldtest import figure_worldtest, worldtest_context
from tapebench.schemas import WORLDTEST_AGGREGATE_COLUMNS, WORLDTEST_COLUMNS
from tapebench.stats.worldtest import aggregate_worldtest
from tapebench.utils.io import read_parquet_meta

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def _records(agent, seed, budget, task, side, scores):
    n = len(scores)
    return pd.DataFrame({"agent": agent, "seed": seed, "budget": budget, "split": "main", "family": "eca", "side": side,
                         "rule": np.arange(n), "problem": 0, "task": task, "length": 1, "score": scores,
                         "success": np.nan, "final_dist": np.nan, "delay": np.nan})[list(WORLDTEST_COLUMNS)]


def test_aggregate_is_the_mean_over_seeds_of_per_seed_means():
    records = pd.concat([
        _records("a", 0, 8, "prediction", "train", [1.0, 0.0, 1.0, 1.0]),     # seed mean 0.75
        _records("a", 1, 8, "prediction", "train", [0.0, 0.0]),               # seed mean 0 (fewer problems)
        _records("a", 2, 8, "prediction", "train", [1.0]),                    # seed mean 1
        _records("a", 0, 8, "detection", "test", [0.5, 0.25]),
    ])
    table = aggregate_worldtest(records, n_resamples=500, ci=0.9, seed=0)
    assert list(table.columns) == WORLDTEST_AGGREGATE_COLUMNS
    pred = table[table.task == "prediction"].iloc[0]
    assert pred["mean"] == pytest.approx((0.75 + 0.0 + 1.0) / 3)          # seeds weigh equally, not problems
    assert pred["n_seeds"] == 3 and pred["problems"] == 7
    assert 0.0 <= pred["ci_low"] <= pred["mean"] <= pred["ci_high"] <= 1.0 and pred["ci_low"] < pred["ci_high"]
    assert pred["chance"] == pytest.approx(1 / 6)
    det = table[table.task == "detection"].iloc[0]
    assert det["mean"] == pytest.approx(0.375) and det["ci_low"] == det["ci_high"] == pytest.approx(0.375)
    assert np.isnan(det["chance"])
    assert table["task"].tolist() == ["prediction", "detection"]           # protocol order


def _config(**worldtest):
    config = load_config([str(REPO / "config" / "config.yaml"), str(REPO / "config" / "quick.yaml")])
    config["studies"]["worldtest"].update(worldtest)
    return config


@pytest.mark.parametrize("worldtest,needle", [
    ({"methods": ["dqn"]}, "does not take part in the world test"),
    ({"methods": ["nope"]}, "unknown method 'nope'"),
    ({"tasks": ["prediction", "guessing"]}, "guessing"),
    ({"budgets": [-1]}, "budgets"),
    ({"planning": {"horizon": 4, "goal_steps": 8}}, "goal_steps': 8 is more than the planning horizon 4"),
    ({"seeds": 9, "methods": ["dreamer"]}, "seeds 0..2 only"),
])
def test_config_errors_name_the_value(worldtest, needle):
    with pytest.raises(ConfigError, match=needle):
        validate_config(_config(**worldtest), SCHEMA)


def test_worldtest_only_methods_cannot_be_table_rows():
    config = _config()
    config["methods"] = [*config["methods"], "active_identify"]
    with pytest.raises(ConfigError, match="takes part in the world test only"):
        validate_config(config, SCHEMA)


def test_table_and_figure_from_an_aggregate(tmp_path):
    rows = [{"agent": a, "family": "eca", "task": t, "side": s, "budget": b, "n_seeds": 2, "problems": 10, "mean": m,
             "ci_low": m - 0.1, "ci_high": m + 0.1, "ci": 0.95, "n_resamples": 100,
             "chance": 1 / 6 if t == "prediction" else np.nan}
            for a, m in (("random", 0.2), ("identify_then_plan", 0.8)) for t in ("prediction", "planning", "detection")
            for s in ("train", "test") for b in (0, 8)]
    table = pd.DataFrame(rows, columns=WORLDTEST_AGGREGATE_COLUMNS)
    context = worldtest_context(table, split="main", L=32)
    assert [m["name"] for m in context["methods"]] == ["Random policy", "Identify-then-plan"]
    assert [r["budget"] for r in context["methods"][0]["rows"]] == [0, 8]
    assert len(context["methods"][1]["rows"][0]["cells"]) == 6 and context["seeds"]
    figure_worldtest(table, tmp_path / "worldtest", split="main")
    assert (tmp_path / "worldtest.png").stat().st_size > 5_000 and (tmp_path / "worldtest.pdf").stat().st_size > 5_000


METHODS = ["random", "mpc", "identify_then_plan", "active_identify"]      # tests/data/tiny.yaml
TARGETS = ("results/worldtest.tex", "results/figures/worldtest.png")


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_tiny_dag_builds_the_worldtest(tiny_build):
    aggregate = pd.read_parquet(tiny_build / "results/worldtest.parquet")
    assert sorted(aggregate["agent"].unique()) == sorted(METHODS)
    assert len(aggregate) == len(METHODS) * 3 * 2 * 2                    # methods x tasks x sides x budgets {0, 4}
    reference = aggregate[aggregate.agent == "mpc"]
    assert (reference[reference.task.isin(["prediction", "detection"])]["mean"] == 1.0).all()
    text = (tiny_build / "results/worldtest.tex").read_text()
    for name in ("Random policy", "True-dynamics MPC", "Identify-then-plan", "Active identification"):
        assert sum(line.startswith(name + " &") for line in text.splitlines()) == 1, name
    assert (tiny_build / "results/figures/worldtest.png").stat().st_size > 5_000
    records = tiny_build / "results/worldtest/main/identify_then_plan/seed0_B4.parquet"
    meta = read_parquet_meta(records)
    assert meta["config"]["budget"] == 4 and meta["config"]["worldtest"]["planner_candidates"] == 16
    assert meta["seed"] == 0 and meta["code_version"]


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_adding_a_budget_schedules_only_its_jobs(tiny_build, tmp_path):
    workdir = copy_workdir(tiny_build, tmp_path / "work")
    proc = snakemake(workdir, "--dry-run", *TARGETS)
    assert proc.returncode == 0 and scheduled_jobs(proc.stdout) == [], proc.stdout[-3000:]
    (workdir / "overlay.yaml").write_text(yaml.safe_dump({"studies": {"worldtest": {"budgets": [0, 4, 16]}}}))
    proc = snakemake(workdir, "--dry-run", *TARGETS, configfiles=("tiny.yaml", "overlay.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_rule = {}
    for rule, wildcards in scheduled_jobs(proc.stdout):
        by_rule.setdefault(rule, []).append(wildcards)
    assert sorted(by_rule) == ["aggregate_worldtest", "render_figure_worldtest", "render_worldtest", "worldtest_method"]
    assert sorted(w["agent"] for w in by_rule["worldtest_method"]) == sorted(METHODS)
    assert all(w["budget"] == "16" for w in by_rule["worldtest_method"])
    # a planner change reruns every world-test job, but no training or evaluation
    (workdir / "overlay.yaml").write_text(yaml.safe_dump({"studies": {"worldtest": {"planner": {"candidates": 8}}}}))
    proc = snakemake(workdir, "--dry-run", *TARGETS, configfiles=("tiny.yaml", "overlay.yaml"))
    rules = {rule for rule, _ in scheduled_jobs(proc.stdout)}
    assert rules == {"aggregate_worldtest", "render_figure_worldtest", "render_worldtest", "worldtest_method"}
    assert len([1 for rule, _ in scheduled_jobs(proc.stdout) if rule == "worldtest_method"]) == len(METHODS) * 2
