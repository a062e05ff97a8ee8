"""The noise study in the pipeline, on the tiny protocol (docs/protocol.md#noise): the success-vs-epsilon table and
figure are built from noisy evaluations of the main split's runs (no new training), epsilon = 0 reuses the
noise-free per-seed tables, the noisy evaluations play the same episodes with epsilon in their protocol, and
adding a level schedules only that level's jobs (and the table and figure)."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml
from pipeline_helpers import copy_workdir, scheduled_jobs, snakemake

from tapebench.utils.io import read_parquet_meta

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build_2")]      # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

TARGETS = ("results/noise.tex", "results/figures/noise.png")
METHODS = ["dqn", "random", "exact"]        # a trained method, a stochastic and a deterministic reference


def _overlay(workdir, levels):
    (workdir / "overlay.yaml").write_text(yaml.safe_dump({"studies": {"noise": {"levels": levels,
                                                                                "methods": METHODS}}}))
    return ("tiny.yaml", "overlay.yaml")


@pytest.fixture(scope="module")
def noise_run(tiny_build, tmp_path_factory):
    workdir = copy_workdir(tiny_build, tmp_path_factory.mktemp("noise"))
    proc = snakemake(workdir, *TARGETS, configfiles=_overlay(workdir, [0.0, 0.1]))
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_noise_table_and_figure_are_built_from_the_levels(noise_run):
    text = (noise_run / "results/noise.tex").read_text()
    assert r"$\varepsilon=0$ & $\varepsilon=0.1$ & $\varepsilon=0$ & $\varepsilon=0.1$" in text
    for name in ("DQN", "Random policy", "Exact optimum"):
        assert sum(line.startswith(name + " &") for line in text.splitlines()) == 1, name
    summary = pd.read_parquet(noise_run / "results/noise.parquet")
    assert len(summary) == len(METHODS) * 2 * 2                       # methods x levels x sides
    assert set(summary["n"][summary["agent"] == "exact"]) == {1} and set(summary["n"][summary["agent"] == "dqn"]) == {2}
    assert (noise_run / "results/figures/noise.pdf").stat().st_size > 5_000
    # epsilon = 0 is the noise-free evaluation: its mean is the mean of the main per-seed table
    per_seed = pd.read_parquet(noise_run / "results/aggregate/main/dqn_H8.per_seed.parquet")
    want = per_seed[(per_seed.side == "test") & (per_seed.metric == "success")]["value"].mean()
    got = summary[(summary.agent == "dqn") & (summary.side == "test") & (summary.noise == 0.0)]["mean"].iloc[0]
    assert got == pytest.approx(want, abs=1e-12)
    assert not (noise_run / "results/noise/main/eps0/dqn").exists()     # no noisy evaluation at epsilon = 0


def test_noisy_evaluations_play_the_same_episodes_with_epsilon_in_the_protocol(noise_run):
    noisy_path = noise_run / "results/noise/main/eps0.1/dqn/seed1_H8.parquet"
    noisy = pd.read_parquet(noisy_path)
    clean = pd.read_parquet(noise_run / "results/runs/main/dqn/seed1/eval_H8.parquet")
    meta = read_parquet_meta(noisy_path)
    assert [p["noise"] for p in meta["evaluation"]["protocols"]] == [0.1, 0.1]
    assert meta["config"]["evaluation"]["noise"] == 0.1 and meta["config"]["evaluation"]["checkpoints"] == 2
    assert all("noise" not in p for p in read_parquet_meta(
        noise_run / "results/runs/main/dqn/seed1/eval_H8.parquet")["evaluation"]["protocols"])
    # the last K = 2 checkpoints of the run, the same (side, rule, episode) as the noise-free evaluation
    assert sorted(noisy["checkpoint"].unique()) == sorted(clean["checkpoint"].unique())[-2:]
    keys = ["checkpoint", "side", "rule", "episode"]
    last = clean[clean["checkpoint"].isin(noisy["checkpoint"].unique())]
    assert noisy[keys].sort_values(keys).values.tolist() == last[keys].sort_values(keys).values.tolist()
    assert (noise_run / "results/runs/main/dqn/seed1/evaluate_H8_noise0.1.log").is_file()


def test_adding_a_level_schedules_only_that_levels_jobs(noise_run):
    proc = snakemake(noise_run, "--dry-run", *TARGETS, configfiles=_overlay(noise_run, [0.0, 0.1]))
    assert proc.returncode == 0 and scheduled_jobs(proc.stdout) == [], proc.stdout[-3000:]
    proc = snakemake(noise_run, "--dry-run", *TARGETS, configfiles=_overlay(noise_run, [0.0, 0.1, 0.2]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = scheduled_jobs(proc.stdout)
    by_rule = {}
    for rule, wildcards in jobs:
        by_rule.setdefault(rule, []).append(wildcards)
    assert sorted(by_rule) == ["aggregate_noise", "aggregate_seed_noise", "evaluate_noise", "evaluate_noise_method",
                               "render_figure_noise", "render_noise"]
    assert all(w["eps"] == "0.2" for rule, ws in by_rule.items() if not rule.startswith("render") for w in ws)
    assert sorted((w["agent"], w["seed"]) for w in by_rule["evaluate_noise"]) == [("dqn", "0"), ("dqn", "1")]
    assert sorted((w["agent"], w["seed"]) for w in by_rule["evaluate_noise_method"]) == [
        ("exact", "0"), ("random", "0"), ("random", "1")]
    assert sorted(w["agent"] for w in by_rule["aggregate_seed_noise"]) == sorted(METHODS)
