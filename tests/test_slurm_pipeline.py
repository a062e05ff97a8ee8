"""The real pipeline through a real (single-node) Slurm cluster, checked against a local run.

One Slurm run and one local run of the tiny protocol (its five tables as targets), side by side, with training long
enough (20k env steps, a checkpoint every 5k) that a training job can be caught mid-run: while the Slurm
run goes, `.ci/slurm_preempt.py` `scancel`s the job training DQN seed 0 as soon as its first resume state
exists; the profile (`retries: 2`) resubmits it and the new job resumes from the last checkpoint. Then:

* every table is byte-identical to the local run's and every Parquet result has equal values (so the
  resumed training changed nothing either);
* every job except `all` went through `sbatch` (snakemake's submissions and the kept Slurm job logs);
* the preempted job resumed from a step > 0, its manifest lists every checkpoint, and every checkpoint's
  weights equal those of the uninterrupted local run.

Skipped unless TAPEBENCH_SLURM=1 and `sinfo` answers (see .ci/slurm_ci.sh). The profile-consistency
check at the end needs no cluster and always runs.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml
from pipeline_helpers import (PREEMPT, REPO, interrupt, job_counts, make_cpu_profile, make_workdir, popen_logged,
                              slurm_available, slurm_submissions, tail)

from tapebench.layout import COMPUTE_TABLE
from tapebench.training import checkpoint as ckpt

RUN_TIMEOUT = 900  # a misconfigured status command makes the slurm executor wait forever: never hang CI
TABLES = ("table1", "table2", "table3", "table4", "table7")
TARGETS = tuple(f"results/{table}.tex" for table in TABLES)   # not `all`: the studies and the report add nothing here
# Long enough to catch a training job between its first checkpoint and its end (~1.5 s and ~6 s into
# DQN's training on an idle core); evaluation stays cheap with 4 checkpoints.
LONG_TRAINING = {"training": {"total_steps": 20000, "eval_every": 5000}}
CHECKPOINT_STEPS = [5000, 10000, 15000, 20000]
PREEMPTED = ("main", "dqn", 0)  # split, agent, seed of the training job cancelled mid-run
CONFIGFILES = ("tiny.yaml", "long_training.yaml")


SKIP_WITHOUT_SLURM = pytest.mark.skipif(not slurm_available(),
                                        reason="needs TAPEBENCH_SLURM=1 and a running Slurm cluster")


def needs_slurm(test):
    return pytest.mark.slurm(SKIP_WITHOUT_SLURM(test))


def run_dir(workdir: Path, split: str, agent: str, seed: int) -> Path:
    return workdir / "results" / "runs" / split / agent / f"seed{seed}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny protocol run through Slurm (with one training job preempted) and locally, concurrently:
    the local run uses the cores the Slurm jobs leave idle while they start up and wait for status checks."""
    profile = make_cpu_profile(tmp_path_factory.mktemp("profile-cpu"))
    local, slurm = (make_workdir(tmp_path_factory.mktemp(name)) for name in ("local", "slurm"))
    for workdir in (local, slurm):
        (workdir / "long_training.yaml").write_text(yaml.safe_dump(LONG_TRAINING))
    slurm_log, local_log = slurm / "snakemake.log", local / "snakemake.log"
    preempted_dir = run_dir(slurm, *PREEMPTED)

    t0 = time.monotonic()
    slurm_proc = popen_logged(
        [sys.executable, "-m", "snakemake", "--profile", str(profile), "--slurm-keep-successful-logs",
         "--configfile", *CONFIGFILES, "--", *TARGETS], slurm_log, cwd=slurm)
    preempt_proc = subprocess.Popen(
        [sys.executable, str(PREEMPT), "--rule", "train", "--wildcards", "_".join(map(str, PREEMPTED)),
         "--wait-file", str(preempted_dir / "resume.pt"), "--timeout", str(RUN_TIMEOUT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    local_proc = popen_logged([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", *CONFIGFILES,
                               "--", *TARGETS], local_log, cwd=local)
    try:
        local_rc = local_proc.wait(timeout=RUN_TIMEOUT)
        local_wall = time.monotonic() - t0
        slurm_rc = slurm_proc.wait(timeout=max(1, RUN_TIMEOUT - (time.monotonic() - t0)))
        slurm_wall = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runs did not finish in {RUN_TIMEOUT}s; Slurm run:\n{tail(slurm_log)}")
    finally:
        for proc in (local_proc, slurm_proc):
            interrupt(proc)
        if preempt_proc.poll() is None:  # still waiting: it never saw the job running with a checkpoint
            preempt_proc.kill()
        preempt_out, preempt_err = preempt_proc.communicate()
    print(f"\n[slurm pipeline] local run {local_wall:.0f}s, Slurm run {slurm_wall:.0f}s (started together)")
    assert local_rc == 0, tail(local_log)
    assert slurm_rc == 0, tail(slurm_log)
    return SimpleNamespace(local=local, slurm=slurm, profile=profile, slurm_output=slurm_log.read_text(),
                           preempt=SimpleNamespace(rc=preempt_proc.returncode, job_id=preempt_out.strip(),
                                                   stderr=preempt_err))


@needs_slurm
def test_tables_are_byte_identical_to_local_run(runs):
    for table in TABLES:
        local_bytes = (runs.local / "results" / f"{table}.tex").read_bytes()
        assert local_bytes, table
        assert (runs.slurm / "results" / f"{table}.tex").read_bytes() == local_bytes, table


@needs_slurm
def test_parquet_results_have_equal_values(runs):
    """Every Parquet file (episodes, per-seed values, aggregates, oracle), compared as frames: the
    provenance in the file metadata is not compared, nor the compute table (what each run cost on its
    machine), whose rows and columns must still agree."""
    local_files = sorted(p.relative_to(runs.local) for p in (runs.local / "results").rglob("*.parquet"))
    slurm_files = sorted(p.relative_to(runs.slurm) for p in (runs.slurm / "results").rglob("*.parquet"))
    assert slurm_files == local_files
    assert Path("results/aggregate/main/aggregate.parquet") in local_files
    compute = Path(COMPUTE_TABLE)
    if compute in local_files:
        local, slurm = pd.read_parquet(runs.local / compute), pd.read_parquet(runs.slurm / compute)
        assert local[["agent", "runs", "eval_jobs"]].equals(slurm[["agent", "runs", "eval_jobs"]])
        local_files.remove(compute)
    for rel in local_files:
        local, slurm = pd.read_parquet(runs.local / rel), pd.read_parquet(runs.slurm / rel)
        assert len(local) > 0, rel
        pd.testing.assert_frame_equal(slurm, local, check_exact=True, obj=str(rel))


@needs_slurm
def test_every_job_ran_inside_a_slurm_job(runs):
    """Each job of the DAG ran in a Slurm job: the jobs executed in the kept Slurm job logs
    (`localrule X:` of the snakemake inside the allocation) are exactly the DAG's jobs, plus the cancelled
    training attempt; grouped rules ran in group jobs, the others one Slurm job each."""
    out = runs.slurm_output
    counts = job_counts(out)
    assert counts.get("train") == 4 and "all" not in counts, out[:3000]
    assert re.findall(r"^localrule (\w+):", out, re.M) == []  # nothing ran outside Slurm
    groups = yaml.safe_load((runs.profile / "config.yaml").read_text())["groups"]
    submissions = slurm_submissions(out)
    assert len({sub["slurm_id"] for sub in submissions}) == len(submissions)
    slurm_logs = runs.slurm / ".snakemake" / "slurm_logs"
    assert sorted(Path(sub["log"]) for sub in submissions) == sorted(slurm_logs.rglob("*.log"))

    executed: dict[str, int] = {}
    for sub in submissions:
        rules = re.findall(r"^localrule (\w+):", Path(sub["log"]).read_text(errors="replace"), re.M)
        assert rules, sub
        if sub["kind"].startswith("group_"):
            assert all(sub["kind"].startswith(f"group_{groups[rule]}_") for rule in rules), sub
        else:
            assert sub["kind"] == f"rule_{rules[0]}" and len(rules) == 1 and rules[0] not in groups, sub
        for rule in rules:
            executed[rule] = executed.get(rule, 0) + 1
    expected = {rule: n for rule, n in counts.items() if rule != "all"}
    expected["train"] += runs.preempt.rc == 0  # the attempt cancelled mid-run
    assert executed == expected


@needs_slurm
def test_preempted_training_job_resumes_from_its_checkpoint(runs):
    assert runs.preempt.rc == 0, f"no job cancelled (helper exit code {runs.preempt.rc}): {runs.preempt.stderr}"
    cancelled = runs.preempt.job_id
    split, agent, seed = PREEMPTED
    jobs = [s["slurm_id"] for s in slurm_submissions(runs.slurm_output)
            if s["kind"] == "rule_train" and s["wildcards"] == f"{split}_{agent}_{seed}"]
    assert len(jobs) == 2 and jobs[0] == cancelled != jobs[1], (jobs, cancelled)
    assert "Trying to restart job" in runs.slurm_output

    resumed = run_dir(runs.slurm, *PREEMPTED)
    train_log = (resumed / "train.log").read_text()
    assert train_log.count(f"training {agent} on") == 1, train_log  # started once, never over
    steps = [int(s) for s in re.findall(r"resuming from resume\.pt at step (\d+)", train_log)]
    assert len(steps) == 1 and steps[0] in CHECKPOINT_STEPS[:-1], train_log
    assert not (resumed / "resume.pt").exists()

    reference = run_dir(runs.local, *PREEMPTED)
    manifest, local_manifest = (json.loads((d / "train.json").read_text()) for d in (resumed, reference))
    assert manifest["resumes"] == 1 and local_manifest["resumes"] == 0
    assert [c["env_steps"] for c in manifest["checkpoints"]] == CHECKPOINT_STEPS
    # sha256 of the checkpoint files too, unless the two runs saw different code versions
    same_code = manifest["provenance"]["code_version"] == local_manifest["provenance"]["code_version"]
    strip = (lambda c: c) if same_code else (lambda c: {k: v for k, v in c.items() if k != "sha256"})
    assert list(map(strip, manifest["checkpoints"])) == list(map(strip, local_manifest["checkpoints"]))

    for entry in manifest["checkpoints"]:
        ours, theirs = ckpt.load(resumed / entry["file"]), ckpt.load(reference / entry["file"])
        assert ours["env_steps"] == theirs["env_steps"] == entry["env_steps"]
        ours, theirs = tensors(ours["policy"]), tensors(theirs["policy"])
        assert ours.keys() == theirs.keys() and ours, entry["file"]
        for name, tensor in theirs.items():
            assert torch.equal(ours[name], tensor), (entry["file"], name)


def tensors(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested state dict ({"q_network": {"0.weight": ...}}), by dotted name."""
    flat = {}
    for key, value in state.items():
        if isinstance(value, dict):
            flat.update(tensors(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_profile_names_only_real_rules():
    """slurm/config.yaml's set-resources and groups name rules of the workflow (a typo there is ignored
    by Snakemake, silently)."""
    listed = subprocess.run([sys.executable, "-m", "snakemake", "--list-rules"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    rules = set(listed.stdout.split())   # every rule, those generated in loops included (report, evaluation)
    assert {"train", "train_block", "evaluate", "evaluate_method", "aggregate_seed", "mpc_split", "render_table3"} <= rules
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    named = set(profile.get("set-resources") or {}) | set(profile.get("groups") or {})
    assert named <= rules, f"not rules of the workflow: {sorted(named - rules)}; rules: {sorted(rules)}"
    assert set(profile.get("group-components") or {}) <= set((profile.get("groups") or {}).values())
