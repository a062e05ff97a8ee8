"""The severity ladder in the pipeline, on the tiny protocol: its split, runs evaluated per level, per-seed tables
with the sides train, d1..d4, the success-vs-d figure and table, and precise reruns."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from pipeline_helpers import copy_workdir, make_workdir, scheduled_jobs, snakemake

from tapebench.rule_family import ELEMENTARY
from tapebench.splits.ladder import distances_to

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build_2")]      # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

FIGURE = "results/figures/ladder.png"


def _dry_run(workdir, *targets, overlay=None):
    files = ("tiny.yaml",)
    if overlay is not None:
        (workdir / "overlay.yaml").write_text(yaml.safe_dump(overlay))
        files = ("tiny.yaml", "overlay.yaml")
    proc = snakemake(workdir, "--dry-run", *targets, configfiles=files)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return scheduled_jobs(proc.stdout)


def test_ladder_runs_train_on_the_ladder_split_with_its_own_seeds(tmp_path):
    workdir = make_workdir(tmp_path)
    jobs = _dry_run(workdir, FIGURE, overlay={"studies": {"ladder": {"methods": ["dqn", "random"], "seeds": 3}}})
    trained = sorted((w["split"], w["agent"], int(w["seed"])) for r, w in jobs if r == "train")
    assert trained == [("ladder", "dqn", s) for s in range(3)]
    evaluated = sorted((r, w["agent"], w["seed"], w["H"]) for r, w in jobs if r in ("evaluate", "evaluate_method"))
    assert evaluated == sorted([("evaluate", "dqn", str(s), "8") for s in range(3)]
                               + [("evaluate_method", "random", str(s), "8") for s in range(3)])
    assert {r for r, _ in jobs} >= {"ladder_split", "split_health", "aggregate", "render_figure_ladder"}
    assert "split" not in {r for r, _ in jobs}          # the ladder split has its own rule


@pytest.fixture(scope="module")
def ladder_run(tiny_build, tmp_path_factory):
    workdir = copy_workdir(tiny_build, tmp_path_factory.mktemp("ladder"))
    proc = snakemake(workdir, FIGURE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_ladder_outputs(ladder_run):
    results = ladder_run / "results"
    split = json.loads((results / "splits/ladder.json").read_text())
    assert sorted(split["levels"]) == ["1", "2", "3", "4"] and all(len(r) == 2 for r in split["levels"].values())
    for d, rules in split["levels"].items():
        assert distances_to(ELEMENTARY, rules, split["train"]).tolist() == [int(d)] * len(rules)
    assert {ELEMENTARY.mirror_rule(z) for z in split["train"]} == set(split["train"])
    assert json.loads((results / "splits/ladder.health.json").read_text())["ok"]

    episodes = pd.read_parquet(results / "runs/ladder/mpc/seed0/eval_H8.parquet")
    by_side = episodes.groupby("side")["rule"].apply(lambda r: sorted(set(r))).to_dict()
    assert by_side == {"train": split["train"], **{f"d{d}": rules for d, rules in split["levels"].items()}}

    per_seed = pd.read_parquet(results / "aggregate/ladder/random_H8.per_seed.parquet")
    assert set(per_seed["side"]) == {"train", "d1", "d2", "d3", "d4"} and set(per_seed["split"]) == {"ladder"}

    table = pd.read_parquet(results / "ladder.parquet")
    assert set(table["agent"]) == {"random", "mpc"}
    assert sorted(set(table["d"])) == [0, 1, 2, 3, 4]
    assert table.set_index(["agent", "d"])["n_rules"].loc["mpc"].tolist() == [len(split["train"]), 2, 2, 2, 2]
    success = per_seed[per_seed["metric"] == "success"].set_index("side")["value"]
    for side, d in (("train", 0), ("d1", 1), ("d4", 4)):   # one seed: the table is that seed's value
        assert table.set_index(["agent", "d"]).loc[("random", d), "mean"] == pytest.approx(success[side])
    tex = (results / "ladder.tex").read_text()
    assert "$d=4$" in tex and "True-dynamics MPC" in tex
    for ext in ("pdf", "png"):
        assert (results / f"figures/ladder.{ext}").stat().st_size > 1000


def test_changing_level_size_reruns_only_ladder_jobs(ladder_run):
    assert _dry_run(ladder_run, FIGURE) == []
    jobs = _dry_run(ladder_run, FIGURE, overlay={"studies": {"ladder": {"level_size": 3}}})
    rules = {r for r, _ in jobs}
    assert rules == {"ladder_split", "split_health", "evaluate_method", "aggregate_seed", "aggregate",
                     "render_figure_ladder"}
    assert {w["split"] for r, w in jobs if "split" in w} == {"ladder"}
    # the methods and seeds of the ladder are not part of its split: adding a seed reruns no split job
    jobs = _dry_run(ladder_run, FIGURE, overlay={"studies": {"ladder": {"seeds": 2}}})
    assert sorted((w["agent"], w["seed"]) for r, w in jobs if r == "evaluate_method") == [("mpc", "1"),
                                                                                         ("random", "1")]
    assert not {r for r, _ in jobs} & {"ladder_split", "split_health", "rule_features"}
