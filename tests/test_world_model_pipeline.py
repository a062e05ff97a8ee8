"""The world-model diagnostics in the pipeline, on the tiny protocol with a small ensemble MPC: the
prediction-error table and figure, the sweep (reusing the main runs for the configured value), planners
evaluated at their last K checkpoints only, and a probe change rerunning only the probe's jobs."""
from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest
import yaml
from pipeline_helpers import REPO, make_workdir, scheduled_jobs, snakemake

pytestmark = pytest.mark.slow       # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

OVERLAY = ("tiny.yaml", "world_models.yaml")
TARGETS = ("results/diagnostics/model_error.tex", "results/diagnostics/sweep.tex", "results/table3.tex")


@pytest.fixture(scope="module")
def wm_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("world_models"))
    shutil.copy(REPO / "tests/data/world_models.yaml", workdir / "world_models.yaml")
    proc = snakemake(workdir, *TARGETS, configfiles=OVERLAY)
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_model_error_table_figure_and_per_run_tables(wm_run):
    results = wm_run / "results"
    table = (results / "diagnostics/model_error.tex").read_text()
    assert re.search(r"^Ensemble MPC & 2 & [0-9.]+ & [0-9.]+ & [0-9.]+ & [0-9.]+ &", table, re.M), table
    for ext in ("pdf", "png"):
        assert (results / f"figures/model_error.{ext}").stat().st_size > 1000
    errors = pd.read_parquet(results / "runs/main/ensemble_mpc/seed1/model_error.parquet")
    assert set(errors["side"]) == {"train", "test"} and sorted(set(errors["depth"])) == [1, 2, 3, 4]
    assert errors["error"].between(0, 1).all() and (errors["n"] >= 1).all()


def test_planner_is_evaluated_at_its_last_k_checkpoints_only(wm_run):
    episodes = pd.read_parquet(wm_run / "results/runs/main/ensemble_mpc/seed0/eval_H8.parquet")
    assert sorted(set(episodes["checkpoint"])) == [256, 384]


def test_sweep_reuses_the_main_runs_for_the_configured_value(wm_run):
    sweeps = wm_run / "results/sweeps/main/ensemble_mpc"
    assert sorted(p.name for p in sweeps.iterdir()) == ["plan_horizon2"]      # 4 is the configured value
    summary = pd.read_parquet(wm_run / "results/diagnostics/sweep.parquet")
    assert sorted(set(summary["value"])) == [2, 4] and set(summary["n_seeds"]) == {2}
    assert "plan horizon" in (wm_run / "results/diagnostics/sweep.tex").read_text()


def test_changing_the_probe_reruns_only_the_probe_jobs(wm_run):
    (wm_run / "probe.yaml").write_text(yaml.safe_dump({"diagnostics": {"model_error": {"depth": 3}}}))
    proc = snakemake(wm_run, "--dry-run", *TARGETS, configfiles=(*OVERLAY, "probe.yaml"))
    assert proc.returncode == 0, proc.stderr
    rules = {rule for rule, _ in scheduled_jobs(proc.stdout)}
    assert {"model_error", "model_error_sweep", "aggregate_model_error", "render_model_error"} <= rules
    assert not rules & {"train", "train_sweep", "evaluate", "evaluate_sweep", "evaluate_method", "render_table3"}
