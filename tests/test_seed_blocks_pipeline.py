"""Seed blocks in the pipeline (training.seeds_per_job, docs/protocol.md#seed-blocks), on a copy of the session's
tiny build (one job per seed): switching to blocks keeps every finished run and Table 3 byte for byte, adding a
seed trains and evaluates only the new seed's block, a hyperparameter edit reruns only that method's blocks, and a second dry
run schedules nothing."""
from __future__ import annotations

import pytest
import yaml
from pipeline_helpers import copy_workdir, scheduled_jobs, snakemake

pytestmark = pytest.mark.xdist_group("tiny_build_2")
TARGET = "results/table3.tex"


def dry_run(workdir, *configfiles):
    proc = snakemake(workdir, TARGET, "--dry-run", configfiles=("tiny.yaml", *configfiles))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return scheduled_jobs(proc.stdout)


def test_seed_blocks_keep_runs_and_rerun_only_what_changed(tiny_build, tmp_path):
    work = copy_workdir(tiny_build, tmp_path / "blocks")
    table3 = (work / TARGET).read_bytes()
    manifest = work / "results/runs/main/dqn/seed0/train.json"
    stamp = manifest.stat().st_mtime_ns
    (work / "blocks.yaml").write_text(yaml.safe_dump({"training": {"seeds_per_job": 2}}))

    jobs = dry_run(work, "blocks.yaml")
    blocks = sorted((wc["split"], wc["agent"], wc["first"], wc["last"]) for rule, wc in jobs if rule == "train_block")
    assert blocks == [("main", "dqn", "0", "1"), ("main", "ppo", "0", "1")]
    assert "train" not in {rule for rule, _ in jobs}
    proc = snakemake(work, "--dry-run", "--forceall", configfiles=("tiny.yaml", "blocks.yaml"))   # every output
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [wc for rule, wc in scheduled_jobs(proc.stdout) if rule == "train"]   # no seed trained twice

    proc = snakemake(work, TARGET, configfiles=("tiny.yaml", "blocks.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert manifest.stat().st_mtime_ns == stamp          # finished runs are left alone
    assert (work / TARGET).read_bytes() == table3          # same runs, same evaluations, same table
    assert dry_run(work, "blocks.yaml") == []
    # DQN and PPO stack bit for bit under "auto" already: `training.stacking: always` changes none of their jobs
    (work / "always.yaml").write_text(yaml.safe_dump({"training": {"stacking": "always"}}))
    assert dry_run(work, "blocks.yaml", "always.yaml") == []

    (work / "three.yaml").write_text(yaml.safe_dump({"seeds": 3}))
    # a real run: the new seed reruns the health gate (a checkpoint), after which Snakemake plans the rest
    proc = snakemake(work, TARGET, configfiles=("tiny.yaml", "blocks.yaml", "three.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = scheduled_jobs(proc.stdout + proc.stderr)
    assert sorted((wc["agent"], wc["first"], wc["last"]) for rule, wc in ran if rule == "train_block") == [
        ("dqn", "2", "2"), ("ppo", "2", "2")]
    # its evaluations too: one job per method and block (docs/protocol.md#seed-blocks)
    assert {rule for rule, _ in ran if rule.startswith("evaluate")} == {"evaluate_seeds2_2", "evaluate_method_seeds2_2"}
    assert manifest.stat().st_mtime_ns == stamp

    (work / "lr.yaml").write_text(yaml.safe_dump({"agents": {"dqn": {"learning_rate": 0.001}}}))
    jobs = dry_run(work, "blocks.yaml", "three.yaml", "lr.yaml")
    assert sorted((wc["agent"], wc["first"], wc["last"]) for rule, wc in jobs if rule == "train_block") == [
        ("dqn", "0", "1"), ("dqn", "2", "2")]
    assert {(rule, wc["agent"]) for rule, wc in jobs if rule.startswith("evaluate") or rule == "aggregate_seed"} == {
        ("evaluate_seeds0_1", "dqn"), ("evaluate_seeds2_2", "dqn"), ("aggregate_seed", "dqn")}
