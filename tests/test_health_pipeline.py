"""The health gate in the pipeline, on the tiny protocol in a throw-away workdir: a split that fails a fatal gate
stops the run with a message naming the gate and the rules before any training job starts; a changed health
threshold reruns only the health jobs (training waits on the verdict through ancient())."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from pipeline_helpers import job_counts, make_workdir, scheduled_jobs, snakemake

pytestmark = pytest.mark.slow       # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

TRAIN_TARGET = "results/runs/main/dqn/seed0/train.json"


def _overlay(workdir, health: dict) -> tuple[str, ...]:
    (workdir / "overlay.yaml").write_text(yaml.safe_dump({"health": health}))
    return ("tiny.yaml", "overlay.yaml")


def test_a_fatal_gate_stops_training_and_a_new_threshold_reruns_only_health(tmp_path):
    workdir = make_workdir(tmp_path)
    # rule 0 sends every tape to the goal, so the random policy solves it: any trivially solved test rule fails
    strict = _overlay(workdir, {"trivially_solved": {"warn": 0.0, "fail": 0.0, "fatal": True}})
    proc = snakemake(workdir, TRAIN_TARGET, configfiles=strict)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    per_rule = pd.read_parquet(workdir / "results/health/main.per_rule.parquet")
    trivial = sorted(int(r) for r in per_rule.loc[per_rule["trivially_solved"], "rule"])
    assert 0 in trivial
    assert f"split main fails gate 'trivially_solved': rules {trivial}" in out
    assert "Error in rule health_gate" in out
    assert "rule train:" not in out                  # printed when a training job starts
    assert not (workdir / TRAIN_TARGET).exists() and not (workdir / "results/runs/main/dqn").exists()
    assert not (workdir / "results/health/main.verdict.json").exists()

    proc = snakemake(workdir, TRAIN_TARGET)          # default thresholds: the split passes and trains
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    trained = (workdir / TRAIN_TARGET).stat().st_mtime_ns
    report = json.loads((workdir / "results/health/main.json").read_text())
    assert report["fatal_failures"] == [] and report["checks"]["trivially_solved"]["fail"] == 0.25

    looser = _overlay(workdir, {"identifiability": {"warn": 0.9, "fail": 1.0, "fatal": False}})
    dry = snakemake(workdir, "--dry-run", TRAIN_TARGET, configfiles=looser)
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert sorted(rule for rule, _ in scheduled_jobs(dry.stdout)) == ["benchmark_health", "health_gate"]
    proc = snakemake(workdir, TRAIN_TARGET, configfiles=looser)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert job_counts(proc.stdout + proc.stderr) == {"benchmark_health": 1, "health_gate": 1}
    assert (workdir / TRAIN_TARGET).stat().st_mtime_ns == trained
    assert json.loads((workdir / "results/health/main.json").read_text())["checks"]["identifiability"]["warn"] == 0.9
