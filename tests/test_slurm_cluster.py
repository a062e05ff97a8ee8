"""The Slurm profile on a live (single-node) Slurm cluster, with a toy workflow: profile lookup, the GPU
request reaching sbatch, and resuming after Snakemake itself was interrupted. The real pipeline through
Slurm (tables identical to a local run, a training job cancelled mid-run resuming) is
tests/test_slurm_pipeline.py.

Skipped unless TAPEBENCH_SLURM=1 and `sinfo` answers. On CI:

    bash .ci/slurm_ci.sh      # install + start the cluster, run the slurm-marked tests, stop it

The CI node has no GPU, so the jobs run with `.ci/slurm_cluster.sh cpu-profile`, a copy of slurm/config.yaml
derived by the script (train's gpu set to 0, requests capped to the node, 2 s before the first status check).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_helpers import REPO, interrupt, make_cpu_profile, popen_logged, slurm_available, tail

TOY = REPO / "tests" / "data" / "slurm_toy" / "Snakefile"
RUN_TIMEOUT = 600  # a misconfigured status command makes the slurm executor wait forever: never hang CI

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_available(), reason="needs TAPEBENCH_SLURM=1 and a running Slurm cluster"),
]


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> Path:
    return make_cpu_profile(tmp_path_factory.mktemp("profile-cpu"))


def snakemake_cmd(workdir: Path, profile: Path | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(TOY), "-d", str(workdir), "--profile", str(profile), *extra]


def run(cmd: list[str], log: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run snakemake with a hard timeout; on timeout interrupt it (it then cancels its Slurm jobs)."""
    proc = popen_logged(cmd, log, cwd)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        interrupt(proc)
        pytest.fail(f"snakemake did not finish in {RUN_TIMEOUT}s:\n{tail(log)}")
    return subprocess.CompletedProcess(cmd, rc, log.read_text(), "")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_profile_resolves_from_repo_root(tmp_path):
    """`snakemake --profile slurm` run from the repository root picks up slurm/config.yaml (dry run)."""
    res = run(snakemake_cmd(tmp_path, "slurm", "-n"), tmp_path / "dry.log", cwd=REPO)
    assert res.returncode == 0, tail(tmp_path / "dry.log")
    assert "train" in res.stdout and "aggregate_seed" in res.stdout


def test_gpu_request_reaches_sbatch(tmp_path):
    """With the real profile, train's `gpu` resource (toy default 1, like config training.gpus) becomes
    `sbatch --gpus=1`; the GRES-free test cluster then rejects the submission."""
    log = tmp_path / "gpu.log"
    res = run(
        snakemake_cmd(tmp_path, REPO / "slurm", "--verbose", "--retries", "0",
                      "--slurm-init-seconds-before-status-checks", "2", "results/train/seed0.json"),
        log,
    )
    assert res.returncode != 0
    calls = [line for line in res.stdout.splitlines() if line.startswith("sbatch call:")]
    assert calls, tail(log)
    assert "--gpus=1" in calls[0] and "--comment rule_train_wildcards_0" in calls[0]


def test_interrupted_run_is_resumed_by_rerun(tmp_path, cpu_profile):
    """Snakemake interrupted (Ctrl-C) mid-training cancels its Slurm jobs; rerunning the same command
    resubmits the job, which resumes from its checkpoint."""
    cmd = snakemake_cmd(tmp_path, cpu_profile, "--config", "train_steps=12")
    ckpt = tmp_path / "results/ckpt/seed0.json"
    log = tmp_path / "first.log"
    proc = popen_logged(cmd, log, REPO)
    try:
        deadline = time.monotonic() + 300
        while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert ckpt.exists(), tail(log)
        time.sleep(2)
    finally:
        interrupt(proc)
    assert proc.returncode != 0
    assert not (tmp_path / "results/train/seed0.json").exists()
    res = run(cmd, tmp_path / "second.log")
    assert res.returncode == 0, tail(tmp_path / "second.log")
    train = load(tmp_path / "results/train/seed0.json")
    assert len(train["jobs"]) == 2 and train["resumed_from"] > 0
