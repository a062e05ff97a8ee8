"""Helpers shared by the pipeline tests (tests/test_pipeline.py) and the Slurm tests (tests/test_slurm_*.py):
a throw-away copy of the workflow, running snakemake in it, parsing its output, and talking to the
single-node test cluster started by .ci/slurm_cluster.sh."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "data" / "tiny.yaml"
CLUSTER = REPO / ".ci" / "slurm_cluster.sh"
PREEMPT = REPO / ".ci" / "slurm_preempt.py"


# --- the workflow in a temporary directory ---------------------------------------------------------
def make_workdir(path: Path) -> Path:
    """A copy of the workflow (not of results) so tests never touch the checkout's results/."""
    for name in ("Snakefile", "workflow", "config", "envs", "reference"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, path / name)
    shutil.copy(TINY, path / "tiny.yaml")
    return path


def copy_workdir(source: Path, dest: Path) -> Path:
    """A copy of a built work directory — results, logs, Snakemake's metadata, modification times kept — for a
    test that reruns or changes things (the shared tiny build itself stays as it was built)."""
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    return dest


def build_tiny(workdir: Path) -> Path:
    """The tiny protocol's whole default DAG in `workdir`, built once: `snakemake.out` holds Snakemake's output
    and `snakemake.returncode` its exit status (a second call only reads them)."""
    status = workdir / "snakemake.returncode"
    if not status.exists():
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        make_workdir(workdir)
        proc = snakemake(workdir)
        (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
        status.write_text(str(proc.returncode))
    assert status.read_text() == "0", (workdir / "snakemake.out").read_text()[-4000:]
    return workdir


def snakemake(workdir: Path, *args: str, configfiles=("tiny.yaml",)) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args, "--configfile", *configfiles]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900)


def scheduled_jobs(dry_run_output: str) -> list[tuple[str, dict]]:
    """(rule, wildcards) of every job in a dry run's output."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", dry_run_output):
        m = re.match(r"(?:local)?rule (\w+):", block.strip())
        if not m:
            continue
        wc = re.search(r"wildcards: (.*)", block)
        wildcards = dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {}
        jobs.append((m.group(1), wildcards))
    return jobs


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table snakemake prints before running: {rule: number of jobs}."""
    m = re.search(r"^job\s+count\n-+\s+-+\n(.*?)^total\s+\d+", output, re.M | re.S)
    if not m:
        return {}
    return {rule: int(n) for rule, n in (line.split() for line in m.group(1).strip().splitlines())}


# --- the Slurm test cluster ------------------------------------------------------------------------
SLURM_SUBMISSION = re.compile(
    r"Job (?P<job>\S+) has been submitted with SLURM jobid (?P<slurm_id>\d+) "
    r"\(log: (?P<log>\S*/slurm_logs/(?P<kind>[^/\s]+)/(?:(?P<wildcards>[^/\s]+)/)?\d+\.log)\)")


def slurm_available() -> bool:
    """TAPEBENCH_SLURM=1 and `sinfo` answers: the Slurm tests run (else they are skipped)."""
    if os.environ.get("TAPEBENCH_SLURM") != "1" or shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def abstract_sockets() -> set[str]:
    """The names of the abstract Unix sockets bound on this machine ("@name", as `ss -x` shows them): the job
    server's (docs/compute.md#job-server)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) > 7 and fields[7].startswith("@")}


def make_cpu_profile(out: Path) -> Path:
    """The CPU-only copy of slurm/config.yaml for this (GPU-less) cluster, written by .ci/slurm_cluster.sh."""
    subprocess.run(["bash", str(CLUSTER), "cpu-profile", str(out)], check=True, capture_output=True, text=True)
    assert (out / "config.yaml").is_file()
    return out


def slurm_submissions(output: str) -> list[dict]:
    """Every sbatch submission snakemake reported: job (snakemake job id, a UUID for group jobs), slurm_id,
    log, kind (`rule_<rule>`, or `group_<group>_<its rules joined by _>`), wildcards (joined by '_'; None for
    rules without wildcards and for group jobs)."""
    return [m.groupdict() for m in SLURM_SUBMISSION.finditer(output)]


def popen_logged(cmd: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start `cmd` with stdout and stderr into `log`. SIGINT is reset to its default in the child, so
    `interrupt()` works even when pytest itself runs in the background (where SIGINT is ignored)."""
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C for snakemake: it cancels its Slurm jobs and releases its lock; kill it if it hangs."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(log: Path, n: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
