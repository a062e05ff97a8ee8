"""The Snakemake pipeline: config validation before any job, lint, the whole DAG on a tiny config,
and precise partial reruns (a DQN hyperparameter change reruns only DQN's jobs and what depends on them)."""
from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from pipeline_helpers import REPO, make_workdir, scheduled_jobs, snakemake


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("pipeline"))
    proc = snakemake(workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("override, key", [
    ({"training": {"total_steps": -5}}, "training.total_steps"),
    ({"env": {"L": 100}}, "env.L"),
    ({"evaluation": {"horizons": []}}, "evaluation.horizons"),
    ({"splits": {"main": {"method": "clever", "test_size": 30, "seed": 0}}}, "splits.main.method"),
    ({"main_split": "nope"}, "main_split"),
    ({"agents": {"dqn": {"learning_rat": 0.1}}}, "agents.dqn"),
    ({"agents": {"sac": {}}}, "agents.sac"),
    ({"methods": ["dqn", "sac"]}, "methods[1]"),
    ({"methods": ["dqn", "exact"], "env": {"L": 32}}, "methods[1]"),
    ({"methods": []}, "methods"),
    ({"seeds": 0}, "seeds"),
])
def test_bad_config_stops_before_any_job(tmp_path, override, key):
    workdir = make_workdir(tmp_path)
    (workdir / "bad.yaml").write_text(yaml.safe_dump(override))
    proc = snakemake(workdir, "--dry-run", configfiles=("tiny.yaml", "bad.yaml"))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"'{key}'" in out, out[-3000:]
    assert not (workdir / "results").exists() and not (workdir / "logs").exists()


def test_tiny_pipeline_produces_tables_and_data(tiny_run):
    results = tiny_run / "results"
    for table in ("table1", "table2", "table3", "table4", "table7"):
        assert (results / f"{table}.tex").stat().st_size > 0
    table3 = (results / "table3.tex").read_text()
    assert re.search(r"^DQN & 2 &", table3, re.M) and re.search(r"^PPO & 2 &", table3, re.M)
    # reference rows under a rule: random policy and MPC with the seeds' streams, the exact optimum once
    assert re.search(r"^Random policy & 2 &", table3, re.M) and re.search(r"^True-dynamics MPC & 2 &.* 100 ", table3, re.M)
    assert re.search(r"^Exact optimum & 1 &", table3, re.M)
    assert table3.index("Reference (not learned)") < table3.index("Random policy &")
    assert table3.count("[") >= 20  # a CI line under each row
    assert "solved by any action" in table3
    for method, seeds in (("random", 2), ("mpc", 2), ("exact", 1)):
        files = sorted((results / "runs/main" / method).glob("seed*/eval_H8.parquet"))
        assert len(files) == seeds, method
        assert not (results / "runs/main" / method / "seed0" / "train.json").exists()
        assert set(pd.read_parquet(files[0])["checkpoint"]) == {0}
    episodes = pd.read_parquet(results / "runs/main/dqn/seed0/eval_H8.parquet")
    assert set(episodes["side"]) == {"train", "test"}
    assert set(episodes["checkpoint"]) == {128, 256}
    aggregate = pd.read_parquet(results / "aggregate/main/aggregate.parquet")
    assert {"agent", "side", "metric", "mean", "ci_low", "ci_high"} <= set(aggregate.columns)
    assert (results / "oracle/feasibility_L8_H8.parquet").exists()


def test_rerun_is_a_no_op(tiny_run):
    proc = snakemake(tiny_run, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert scheduled_jobs(proc.stdout) == [], proc.stdout[-3000:]


def test_changing_dqn_hyperparameter_reruns_only_dqn_jobs(tiny_run):
    (tiny_run / "lr.yaml").write_text(yaml.safe_dump({"agents": {"dqn": {"learning_rate": 0.001}}}))
    proc = snakemake(tiny_run, "--dry-run", configfiles=("tiny.yaml", "lr.yaml"))
    assert proc.returncode == 0, proc.stderr
    jobs = scheduled_jobs(proc.stdout)
    rules = {rule for rule, _ in jobs}
    trained = sorted((wc["agent"], wc["seed"]) for rule, wc in jobs if rule == "train")
    assert trained == [("dqn", "0"), ("dqn", "1")]
    assert {wc["agent"] for rule, wc in jobs if rule in ("evaluate", "aggregate_seed")} == {"dqn"}
    assert {"evaluate", "aggregate_seed", "aggregate", "render_table3"} <= rules
    assert not rules & {"rule_features", "split", "split_health", "mpc_split", "feasibility",
                        "fixed_z_oracle", "mpc_by_type"}


def test_changing_a_reference_method_reruns_only_its_evaluations(tiny_run):
    (tiny_run / "mpc.yaml").write_text(yaml.safe_dump({"agents": {"mpc": {"candidates": 32}}}))
    proc = snakemake(tiny_run, "--dry-run", configfiles=("tiny.yaml", "mpc.yaml"))
    assert proc.returncode == 0, proc.stderr
    jobs = scheduled_jobs(proc.stdout)
    rules = {rule for rule, _ in jobs}
    assert sorted((wc["agent"], wc["seed"], wc["H"]) for rule, wc in jobs if rule == "evaluate_method") == [
        ("mpc", s, h) for s in ("0", "1") for h in ("16", "8")]
    assert "train" not in rules and "evaluate" not in rules
    assert {wc["agent"] for rule, wc in jobs if rule == "aggregate_seed"} == {"mpc"}
