"""The studies in the pipeline, on the tiny protocol: the fixed-z job layout (runs at the study's own L, H, one
per method x rule x seed), the seeds per split of the robustness study, the study targets built, and the protocol
comparison (built in the same run; a change of its metric reruns only it and its renders)."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml
from pipeline_helpers import copy_workdir, make_workdir, scheduled_jobs, snakemake
from scipy import stats as sps

from tapebench.report.per_type import HEADROOM_ROW

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build_2")]      # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

TARGETS = ("results/table5.tex", "results/table6.tex", "results/table_types.tex", "results/figures/figure5.png",
           "results/protocols/comparison.tex", "results/figures/protocol_comparison.png")


def _dry_run(workdir, *targets, overlay=None):
    files = ("tiny.yaml",)
    if overlay is not None:
        (workdir / "overlay.yaml").write_text(yaml.safe_dump(overlay))
        files = ("tiny.yaml", "overlay.yaml")
    proc = snakemake(workdir, "--dry-run", "--printshellcmds", *targets, configfiles=files)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_fixed_z_runs_use_the_study_L_and_H(tmp_path):
    workdir = make_workdir(tmp_path)
    overlay = {"studies": {"fixed_z": {"rules": [4, 30, 110], "seeds": 2,
                                       "table5": {"L": 12, "H": 10, "methods": ["rad_dqn"]},
                                       "table6": {"L": 9, "H": 7, "methods": ["pearl_dqn"],
                                                  "multi_rule": ["rad_dqn"]}}}}
    out = _dry_run(workdir, "results/table5.tex", "results/table6.tex", overlay=overlay)
    jobs = scheduled_jobs(out)
    fixed = sorted((w["L"], w["H"], w["agent"], int(w["rule"]), int(w["seed"])) for r, w in jobs if r == "train_fixed_z")
    assert fixed == sorted([("12", "10", "rad_dqn", z, s) for z in (4, 30, 110) for s in (0, 1)]
                           + [("9", "7", "pearl_dqn", z, s) for z in (4, 30, 110) for s in (0, 1)])
    multi = sorted((w["L"], w["H"], w["split"], w["agent"], w["seed"]) for r, w in jobs if r == "train_multi_rule")
    assert multi == [("9", "7", "main", "rad_dqn", "0"), ("9", "7", "main", "rad_dqn", "1")]
    assert sorted(w["side"] for r, w in jobs if r == "oracle_multi_rule") == ["test", "train"]
    assert [(w["L"], w["H"]) for r, w in jobs if r == "fixed_z_oracle"] == [("9", "7")]
    # the env of the training jobs is the study's, not env.L / env.H (8 / 8 in tiny)
    shell = re.findall(r"tapebench train --agent rad_dqn --rules 4 --seed 0 --params '(\{.*?\})'", out)
    assert shell, out[-3000:]
    params = json.loads(shell[0])
    assert params["env"]["L"] == 12 and params["env"]["H"] == 10
    assert params["training"] == {"total_steps": 256, "eval_every": 128}
    assert not any(r in ("train", "evaluate") for r, _ in jobs)      # no main-protocol run is needed


def test_robustness_seeds_per_split(tmp_path):
    workdir = make_workdir(tmp_path)
    overlay = {"seeds": 2, "studies": {"robustness": {"splits": ["main", "random1", "diverse2"], "seeds": 3}}}
    jobs = scheduled_jobs(_dry_run(workdir, "results/figures/figure5.png", overlay=overlay))
    runs = {}
    for rule, w in jobs:
        if rule == "train":
            runs.setdefault(w["split"], set()).add((w["agent"], int(w["seed"])))
    assert runs["main"] == {(a, s) for a in ("dqn", "ppo") for s in (0, 1)}
    for split in ("random1", "diverse2"):
        assert runs[split] == {(a, s) for a in ("dqn", "ppo") for s in (0, 1, 2)}
    # other splits are evaluated at the training horizon only; main keeps every horizon
    horizons = {(w["split"], w["H"]) for rule, w in jobs if rule in ("evaluate", "evaluate_method")}
    assert horizons == {("main", "8"), ("main", "16"), ("random1", "8"), ("diverse2", "8")}
    exact = {(w["split"], w["seed"]) for rule, w in jobs if rule == "evaluate_method" and w["agent"] == "exact"}
    assert exact == {("main", "0"), ("random1", "0"), ("diverse2", "0")}


@pytest.fixture(scope="module")
def studies_run(tiny_build, tmp_path_factory):
    workdir = copy_workdir(tiny_build, tmp_path_factory.mktemp("studies"))
    proc = snakemake(workdir, *TARGETS)
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_study_targets_are_built(studies_run):
    results = studies_run / "results"
    table5 = (results / "table5.tex").read_text()
    assert re.search(r"^0 & stable & DQN \+ RAD & [01]\.\d\d ", table5, re.M), table5
    assert re.search(r"^30 & chaotic & DQN \+ RAD & ", table5, re.M)
    manifest = json.loads((results / "fixed_z/L8_H8/rad_dqn/rule30/seed0/train.json").read_text())
    assert manifest["env"]["L"] == 8
    episodes = pd.read_parquet(results / "fixed_z/L8_H8/rad_dqn/rule30/seed0/eval.parquet")
    assert set(episodes["rule"]) == {30} and set(episodes["side"]) == {"rules"}

    table6 = (results / "table6.tex").read_text()
    for row in (r"^True-dynamics MPC & episodes \(\d+ / \d+\) & ", r"^Exact optimum & episodes", r"^PEARL-DQN & seeds \(1\)",
                r"^0 & stable & 1\.00 & 1\.00 & ", r"^30 & chaotic & "):
        assert re.search(row, table6, re.M), (row, table6)

    types = pd.read_parquet(results / "table_types.parquet")
    # the methods, and the MPC's rule-dependent headroom over the rule-agnostic floor as its own row
    assert set(types["stratum"]) >= {"micro", "macro"} and set(types["agent"]) == {"dqn", "ppo", "random", "mpc", "exact",
                                                                                  HEADROOM_ROW}
    micro = types[(types["stratum"] == "micro") & (types["agent"] != HEADROOM_ROW)].set_index(["agent", "side"])["mean"]
    aggregate = pd.read_parquet(results / "aggregate/main/aggregate.parquet")
    overall = aggregate[(aggregate["H"] == 8) & (aggregate["metric"] == "success")].set_index(["agent", "side"])["mean"]
    for key, value in micro.items():     # same episodes per rule: micro = the overall success of Table 3
        assert value == pytest.approx(overall[key])

    robustness = pd.read_parquet(results / "robustness.parquet")
    assert set(robustness["split"]) == {"main", "random1"}
    seeds = robustness.set_index(["split", "agent"])["n_seeds"]
    assert seeds[("main", "dqn")] == 2 and seeds[("random1", "dqn")] == 1 and seeds[("random1", "exact")] == 1
    for ext in ("pdf", "png"):
        assert (results / f"figures/figure5.{ext}").stat().st_size > 1000


def test_protocol_comparison_is_built(studies_run):
    results = studies_run / "results"
    comparison = pd.read_parquet(results / "protocols/comparison.parquet")
    ranks = pd.read_parquet(results / "protocols/ranks.parquet")
    names = ["OOD", "ID", "OOD H=16", "OOD random1", "ladder d=1", "ladder d=2", "ladder d=3", "ladder d=4",
             "OOD eps=0.1"]
    assert list(dict.fromkeys(ranks["protocol"])) == names
    assert len(comparison) == len(names) * (len(names) - 1) // 2 and comparison["reference"].sum() == len(names) - 1
    assert set(ranks["agent"]) == {"dqn", "ppo", "random", "mpc", "exact"}
    # tau vs the reference recomputed from the per-seed tables: means over seeds, scipy's tau-b
    methods = ["dqn", "ppo", "random", "mpc", "exact"]

    def means(split, H, side, folder="aggregate/{split}"):
        frames = [pd.read_parquet(results / folder.format(split=split) / f"{m}_H{H}.per_seed.parquet")
                  for m in methods]
        rows = pd.concat(frames)
        rows = rows[(rows["side"] == side) & (rows["metric"] == "success")]
        return rows.groupby("agent")["value"].mean().reindex(methods).round(12)

    reference = means("main", 8, "test")
    for name, (split, H, side) in {"ID": ("main", 8, "train"), "OOD H=16": ("main", 16, "test"),
                                   "OOD random1": ("random1", 8, "test")}.items():
        row = comparison[(comparison["protocol_a"] == "OOD") & (comparison["protocol_b"] == name)].iloc[0]
        expected = sps.kendalltau(reference, means(split, H, side)).statistic
        assert row["tau"] == pytest.approx(expected, nan_ok=True), name
        assert row["n_methods"] == 5 and row["tau_ci_low"] <= row["tau"] + 1e-9 <= row["tau_ci_high"] + 2e-9
    noisy = comparison[(comparison["protocol_a"] == "OOD") & (comparison["protocol_b"] == "OOD eps=0.1")].iloc[0]
    expected = sps.kendalltau(reference, means("main", 8, "test", "noise/{split}/eps0.1")).statistic
    assert noisy["tau"] == pytest.approx(expected, nan_ok=True) and noisy["n_methods"] == 5
    # the ladder runs its own methods (random, mpc): compared on the two it shares with the reference
    ladder = comparison[(comparison["protocol_a"] == "OOD") & comparison["protocol_b"].str.startswith("ladder")]
    assert len(ladder) == 4 and set(ladder["n_methods"]) == {2}
    tex = (results / "protocols/comparison.tex").read_text()
    assert re.search(r"^\\textsf\{OOD random1\} & \\texttt\{random1\} & 8 & OOD & 1 & 5 & ", tex, re.M), tex
    for ext in ("pdf", "png"):
        assert (results / f"figures/protocol_comparison.{ext}").stat().st_size > 5000


def test_protocol_comparison_metric_reruns_only_the_comparison(studies_run):
    out = _dry_run(studies_run, *TARGETS, overlay={"studies": {"protocol_comparison": {"metric": "final_dist"}}})
    assert sorted(rule for rule, _ in scheduled_jobs(out)) == [
        "protocol_comparison", "render_protocol_comparison", "render_protocol_comparison_figure"]
