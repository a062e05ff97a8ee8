"""Runs a toy workflow through the repository's Slurm profile on a live (single-node) Slurm cluster.

Skipped unless TAPEBENCH_SLURM=1 and `sinfo` answers. On CI:

    .ci/slurm_cluster.sh install && .ci/slurm_cluster.sh start
    TAPEBENCH_SLURM=1 python -m pytest -m slurm tests/test_slurm_cluster.py
    .ci/slurm_cluster.sh stop

The CI node has no GPU, so the jobs run with `.ci/slurm_cluster.sh cpu-profile`, a copy of slurm/config.yaml
derived by the script (train's gpu set to 0, requests capped to the node, 2 s before the first status check).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "data" / "slurm_toy" / "Snakefile"
CLUSTER = REPO / ".ci" / "slurm_cluster.sh"
PREEMPT = REPO / ".ci" / "slurm_preempt.py"
RUN_TIMEOUT = 600  # a misconfigured status command makes the slurm executor wait forever: never hang CI


def _slurm_available() -> bool:
    if os.environ.get("TAPEBENCH_SLURM") != "1" or shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not _slurm_available(), reason="needs TAPEBENCH_SLURM=1 and a running Slurm cluster"),
]


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile-cpu")
    subprocess.run(["bash", str(CLUSTER), "cpu-profile", str(out)], check=True, capture_output=True, text=True)
    assert (out / "config.yaml").is_file()
    return out


def snakemake_cmd(workdir: Path, profile: Path | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(TOY), "-d", str(workdir), "--profile", str(profile), *extra]


def run(cmd: list[str], log: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run snakemake with a hard timeout; on timeout interrupt it (it then cancels its Slurm jobs)."""
    with open(log, "w") as fh:
        proc = _popen(cmd, fh, cwd)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            _interrupt(proc)
            pytest.fail(f"snakemake did not finish in {RUN_TIMEOUT}s:\n{_tail(log)}")
    return subprocess.CompletedProcess(cmd, rc, log.read_text(), "")


def _popen(cmd, fh, cwd=REPO) -> subprocess.Popen:
    # SIGINT back to default, so that _interrupt() works even when pytest was started in the background.
    return subprocess.Popen(
        cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # snakemake cancels its Slurm jobs and releases its lock on SIGINT
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path, n: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_profile_resolves_from_repo_root(tmp_path):
    """`snakemake --profile slurm` run from the repository root picks up slurm/config.yaml (dry run)."""
    res = run(snakemake_cmd(tmp_path, "slurm", "-n"), tmp_path / "dry.log", cwd=REPO)
    assert res.returncode == 0, _tail(tmp_path / "dry.log")
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
    assert calls, _tail(log)
    assert "--gpus=1" in calls[0] and "--comment rule_train_wildcards_0" in calls[0]


def test_toy_workflow(tmp_path, cpu_profile):
    t0 = time.monotonic()
    log = tmp_path / "toy.log"
    res = run(snakemake_cmd(tmp_path, cpu_profile, "--verbose"), log)
    wall = time.monotonic() - t0
    assert res.returncode == 0, _tail(log)
    train = load(tmp_path / "results/train/seed0.json")
    evaluate = load(tmp_path / "results/eval/seed0.json")
    agg = load(tmp_path / "results/agg/seed0.json")
    # every job ran inside a Slurm allocation
    assert train["slurm_job_id"] and evaluate["slurm_job_id"] and agg["slurm_job_id"]
    assert train["resumed_from"] == 0 and train["steps"] == 3
    # evaluate and aggregate_seed are grouped by the profile into one Slurm job, separate from train
    assert evaluate["slurm_job_id"] == agg["slurm_job_id"] != train["slurm_job_id"]
    assert "--comment rule_eval_" in res.stdout  # group job comment
    print(f"toy workflow wall time: {wall:.1f}s")


def test_cancelled_job_is_resubmitted_and_resumes(tmp_path, cpu_profile):
    """scancel of the running train job (a preemption without requeue): `retries` resubmits it, and the new
    Slurm job resumes from the checkpoint the cancelled one left behind."""
    log = tmp_path / "preempt.log"
    with open(log, "w") as fh:
        proc = _popen(snakemake_cmd(tmp_path, cpu_profile, "--config", "train_steps=12"), fh)
        try:
            pre = subprocess.run(
                [sys.executable, str(PREEMPT), "--rule", "train", "--wildcards", "0",
                 "--wait-file", str(tmp_path / "results/ckpt/seed0.json"), "--delay", "2", "--timeout", "300"],
                capture_output=True, text=True, timeout=330,
            )
            assert pre.returncode == 0, pre.stderr
            cancelled = pre.stdout.strip()
            rc = proc.wait(timeout=RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                _interrupt(proc)
    assert rc == 0, _tail(log)
    assert "Trying to restart job" in log.read_text()
    train = load(tmp_path / "results/train/seed0.json")
    assert [j["slurm_job_id"] for j in train["jobs"]][0] == cancelled
    assert len(train["jobs"]) == 2 and train["jobs"][1]["slurm_job_id"] != cancelled
    assert train["resumed_from"] > 0 and train["steps"] == 12


def test_interrupted_run_is_resumed_by_rerun(tmp_path, cpu_profile):
    """Snakemake interrupted (Ctrl-C) mid-training cancels its Slurm jobs; rerunning the same command
    resubmits the job, which resumes from its checkpoint."""
    cmd = snakemake_cmd(tmp_path, cpu_profile, "--config", "train_steps=12")
    ckpt = tmp_path / "results/ckpt/seed0.json"
    log = tmp_path / "first.log"
    with open(log, "w") as fh:
        proc = _popen(cmd, fh)
        deadline = time.monotonic() + 300
        while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert ckpt.exists(), _tail(log)
        time.sleep(2)
        _interrupt(proc)
    assert proc.returncode != 0
    assert not (tmp_path / "results/train/seed0.json").exists()
    res = run(cmd, tmp_path / "second.log")
    assert res.returncode == 0, _tail(tmp_path / "second.log")
    train = load(tmp_path / "results/train/seed0.json")
    assert len(train["jobs"]) == 2 and train["resumed_from"] > 0
