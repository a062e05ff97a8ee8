"""The figures and the rliable-style outputs in the pipeline, on the tiny protocol: every registered figure
target builds from what the pipeline writes, and what is drawn agrees with the pipeline's tables."""
from __future__ import annotations

import re

import pandas as pd
import pytest
from pipeline_helpers import copy_workdir, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build")]      # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

FIGURES = ("figure1_rollout", "figure4_spacetime", "figure3_per_rule", "learning_curves", "oracle_gap",
           "probability_of_improvement", "performance_profile")
TARGETS = (*(f"results/figures/{f}.png" for f in FIGURES), "results/rliable.tex")
METHODS = ["dqn", "ppo", "random", "mpc", "exact"]        # tests/data/tiny.yaml


@pytest.fixture(scope="module")
def figures_run(tiny_build, tmp_path_factory):
    workdir = copy_workdir(tiny_build, tmp_path_factory.mktemp("figures"))
    proc = snakemake(workdir, *TARGETS)
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_every_figure_is_written_as_pdf_and_png(figures_run):
    for name in FIGURES:
        for ext in ("pdf", "png"):
            assert (figures_run / f"results/figures/{name}.{ext}").stat().st_size > 5000, (name, ext)


def test_rliable_table_holds_every_method_and_matches_the_per_rule_tables(figures_run):
    results = figures_run / "results"
    summary = pd.read_parquet(results / "rliable.parquet")
    assert sorted(set(summary["agent"])) == sorted(METHODS) and set(summary["side"]) == {"train", "test"}
    per_rule = pd.concat(pd.read_parquet(results / f"aggregate/main/{m}_H8.per_rule.parquet") for m in METHODS)
    ood = per_rule[(per_rule["side"] == "test") & (per_rule["metric"] == "success")]
    for agent, grp in ood.groupby("agent"):
        expected = grp.groupby("rule")["value"].mean().mean()       # mean over rules of the mean over seeds
        row = summary[(summary["agent"] == agent) & (summary["side"] == "test") & (summary["statistic"] == "mean")]
        assert row["point"].item() == pytest.approx(expected)
        assert row["n_runs"].item() == grp["seed"].nunique()
    assert set(summary.loc[summary["agent"] == "exact", "n_runs"]) == {1}     # deterministic: one seed
    tex = (results / "rliable.tex").read_text()
    assert re.search(r"^DQN & 2 & [0-9.]+ &", tex, re.M) and "Exact optimum & 1" in tex
    poi = pd.read_parquet(results / "probability_of_improvement.parquet")
    assert len(poi) == len(METHODS) * (len(METHODS) - 1)
    pairs = poi.set_index(["method_x", "method_y"])["probability"]
    assert pairs[("dqn", "mpc")] + pairs[("mpc", "dqn")] == pytest.approx(1.0)


def test_curves_exist_for_trained_methods_and_reference_methods_have_one_checkpoint(figures_run):
    curves = pd.read_parquet(figures_run / "results/aggregate/main/dqn_H8.curves.parquet")
    assert sorted(set(curves["checkpoint"])) == [128, 256]
    random = pd.read_parquet(figures_run / "results/aggregate/main/random_H8.curves.parquet")
    assert random["checkpoint"].nunique() == 1
