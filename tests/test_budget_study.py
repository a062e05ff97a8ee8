"""The budget study (docs/protocol.md#budget-study): each budget trains runs of its own, its checkpoints spread like the
main schedule's, the main budget reuses the main runs, and the table and figure put every budget beside the main
study's best rule-agnostic row and the true-dynamics MPC. On the tiny protocol (tests/data/tiny.yaml: PPO at 128 and
256 steps, 2 seeds; 256 is the main budget)."""
from __future__ import annotations

import json
import re
from collections import Counter

import pandas as pd
import pytest
import torch
from pipeline_helpers import copy_workdir, scheduled_jobs, snakemake

from tapebench.pipeline.config import ConfigError, load_config, validate_config
from tapebench.report.budget import reference_lines
from tapebench.settings import budget_schedule, checkpoints_per_run

SCHEMA = "workflow/schemas/config.schema.yaml"


def _config(**budget):
    config = load_config(["config/config.yaml"])
    config["studies"]["budget"] = {"methods": ["ppo"], "budgets": [200000, 1000000], "seeds": 3, **budget}
    return config


def test_a_budget_spreads_the_main_schedules_checkpoints_over_its_steps():
    config = validate_config(_config(budgets=[0, 200000]), SCHEMA)
    assert budget_schedule(config, 0) == (0, 1)                         # untrained: one checkpoint, at step 0
    assert budget_schedule(config, 200000) == (200000, 10000)           # the main budget: the main schedule
    assert budget_schedule(config, 1000000) == (1000000, 50000)
    assert budget_schedule(config, 3000000) == (3000000, 150000)
    assert {checkpoints_per_run(*budget_schedule(config, b)) for b in (200000, 1000000, 3000000, 777777)} == {20}


@pytest.mark.parametrize("budget, key, words", [
    ({"methods": ["random"]}, "studies.budget.methods[0]", "does not train"),
    ({"methods": ["no_such_method"]}, "studies.budget.methods[0]", "unknown method"),
    ({"budgets": [200000, 2]}, "studies.budget.budgets[1]", "fewer than evaluation.last_k = 3"),
])
def test_a_budget_study_that_cannot_run_is_refused_naming_the_key(budget, key, words):
    with pytest.raises(ConfigError, match=rf"'{re.escape(key)}'.*{re.escape(words)}"):
        validate_config(_config(**budget), SCHEMA)


def test_a_grid_config_refuses_a_budget_method_without_grids():
    config = load_config(["config/config.yaml", "config/grid.yaml"])
    config["studies"]["budget"] = {"methods": ["ppo_dr"], "budgets": [1000], "seeds": 1}
    with pytest.raises(ConfigError, match=r"'studies.budget.methods\[0\]'.*ppo_dr"):
        validate_config(config, SCHEMA)


def _summary(rows):
    base = {"split": "main", "L": 8, "H": 8, "metric": "success", "n": 2}
    return pd.DataFrame([{**base, "agent": a, "side": s, "mean": m, "ci_low": m - 0.01, "ci_high": m + 0.01}
                         for a, s, m in rows])


def test_the_floor_is_the_rule_agnostic_row_best_on_held_out_rules():
    summary = _summary([("random", "train", 0.30), ("random", "test", 0.10),
                            ("live_random", "train", 0.20), ("live_random", "test", 0.25),
                            ("dqn", "test", 0.90), ("mpc", "train", 0.6), ("mpc", "test", 0.5)])
    lines = reference_lines(summary, split="main", H=8)
    assert set(lines[lines.role == "floor"]["method"]) == {"live_random"}      # not random (ID), not DQN (learned)
    assert list(lines[lines.role == "planner"].sort_values("side")["mean"]) == [0.5, 0.6]
    assert reference_lines(_summary([("dqn", "test", 0.9)]), split="main", H=8).empty



@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_the_tiny_build_trains_only_the_budgets_it_lacks_and_reuses_the_main_runs(tiny_build):
    results = tiny_build / "results"
    summary = pd.read_parquet(results / "budget.parquet")
    assert sorted(set(summary["steps"])) == [0, 128, 256] and set(summary["n"]) == {2}
    assert not (results / "budgets/main/ppo/steps256").exists()             # the main budget: the main runs
    for seed in (0, 1):
        record = json.loads((results / f"budgets/main/ppo/steps128/seed{seed}/train.json").read_text())
        assert (record["training"]["total_steps"], record["training"]["eval_every"]) == (128, 64)
    # the main budget's point is the main per-seed value, over the same last K checkpoints
    per_seed = pd.read_parquet(results / "aggregate/main/ppo_H8.per_seed.parquet")
    want = per_seed[(per_seed.side == "test") & (per_seed.metric == "success")]["value"].mean()
    got = summary[(summary.steps == 256) & (summary.side == "test")]["mean"].iloc[0]
    assert got == pytest.approx(want, abs=1e-12)
    text = (results / "budget.tex").read_text()
    assert text.count("PPO & ") == 3 and "PPO & 0 (untrained) & 2" in text and "True-dynamics MPC &" in text
    assert (results / "figures/budget.pdf").stat().st_size > 5_000


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_adding_a_budget_schedules_only_that_budgets_runs(tiny_build, tmp_path):
    workdir = copy_workdir(tiny_build, tmp_path / "budget")
    (workdir / "more.yaml").write_text("studies:\n  budget: {budgets: [128, 192, 256]}\n")
    proc = snakemake(workdir, "--dry-run", "results/budget.tex", configfiles=("tiny.yaml", "more.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled_jobs(proc.stdout)
    assert Counter(rule for rule, _ in jobs) == {"train_budget": 2, "evaluate_budget": 2, "aggregate_budget_point": 1,
                                                 "render_budget": 1}, jobs
    assert {w.get("steps") for rule, w in jobs if rule != "render_budget"} == {"192"}


def _same_tensors(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_budget_zero_evaluates_the_untrained_network(tiny_build):
    """Budget 0's one checkpoint is the initialisation: the same weights as the 128-step run's checkpoint at 64 steps,
    before PPO's first update (4 envs x 32 steps = 128 in tests/data/tiny.yaml)."""
    runs = tiny_build / "results/budgets/main/ppo"
    for seed in (0, 1):
        untrained = json.loads((runs / f"steps0/seed{seed}/train.json").read_text())
        assert [c["env_steps"] for c in untrained["checkpoints"]] == [0]
        assert untrained["training"]["total_steps"] == 0
        first = json.loads((runs / f"steps128/seed{seed}/train.json").read_text())["checkpoints"][0]
        assert first["env_steps"] == 64
        a = torch.load(runs / f"steps0/seed{seed}" / untrained["checkpoints"][0]["file"], weights_only=False)
        b = torch.load(runs / f"steps128/seed{seed}" / first["file"], weights_only=False)
        assert _same_tensors(a["policy"], b["policy"])
    seeds = pd.read_parquet(tiny_build / "results/budgets/main/ppo_steps0.per_seed.parquet")
    assert set(seeds["seed"]) == {0, 1}
