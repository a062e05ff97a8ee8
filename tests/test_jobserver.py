"""The job server (docs/compute.md#job-server): a command run through it writes what the same command writes in its
own process, exit status and error messages included; a killed client ends its fork; without a server the command
runs in its own process; a server ends with its pipeline. (That the pipeline runs its local jobs through one: tests/test_pipeline.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from agent_contract import tensors_equal, toy_split, train_args

from tapebench import jobserver
from tapebench.utils.job_client import SOCKET_VARIABLE

TAPEBENCH = [sys.executable, "-m", "tapebench"]
TIMINGS = {"wall_time_s", "cpu_time_s", "steps_per_second", "seconds", "cpu_seconds"}


@pytest.fixture(scope="module")
def server():
    handle = jobserver.start(log=lambda message: None)
    assert handle is not None, "the job server did not start"
    yield handle
    jobserver.stop(handle)
    os.environ.pop(SOCKET_VARIABLE, None)


def run(args, cwd, through_server: bool, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not through_server:
        env.pop(SOCKET_VARIABLE, None)
    return subprocess.run([*TAPEBENCH, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


def forks(server) -> list[int]:
    """The server's live children (its forks)."""
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if Path(f"/proc/{c}").exists()
            and Path(f"/proc/{c}/stat").read_text().split()[2] != "Z"]


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_train_and_evaluate_through_the_server_write_what_their_own_processes_write(server, tmp_path):
    split = toy_split(tmp_path / "toy.json")
    params = {"agent": {"learning_starts": 64, "batch_size": 16}, "env": {"L": 8, "H": 8},
              "training": {"total_steps": 256, "eval_every": 128}}
    outputs = {}
    for through in (True, False):
        out = tmp_path / f"run_{through}"
        trained = run(train_args("dqn", split, out, params), tmp_path, through)
        assert trained.returncode == 0, trained.stderr
        evaluated = run(["evaluate", "--run", out, "--split", split, "--H", 8, "--params",
                         json.dumps({"env": {"L": 8, "H": 8}, "evaluation": {"episodes_per_rule": 2}}),
                         "--threads", 1, "--out", out / "eval_H8.parquet"], tmp_path, through)
        assert evaluated.returncode == 0, evaluated.stderr
        outputs[through] = out
    served, alone = outputs[True], outputs[False]
    assert without_timings(json.loads((served / "train.json").read_text()))["checkpoints"] == \
        without_timings(json.loads((alone / "train.json").read_text()))["checkpoints"]
    checkpoints = sorted(p.name for p in alone.glob("*.pt"))
    assert checkpoints and checkpoints == sorted(p.name for p in served.glob("*.pt"))
    for name in checkpoints:
        a, b = (torch.load(d / name, weights_only=False) for d in (served, alone))
        assert tensors_equal(a["agent"], b["agent"]), name
    assert pq.read_table(served / "eval_H8.parquet").equals(pq.read_table(alone / "eval_H8.parquet"))


def test_exit_status_and_error_message_come_back(server, tmp_path):
    served = run(["evaluate", "--method", "random", "--seed", 0, "--split", tmp_path / "missing.json", "--H", 8,
                  "--out", tmp_path / "x.parquet"], tmp_path, True)
    alone = run(["evaluate", "--method", "random", "--seed", 0, "--split", tmp_path / "missing.json", "--H", 8,
                 "--out", tmp_path / "x.parquet"], tmp_path, False)
    assert served.returncode == alone.returncode == 2
    assert "split file not found" in served.stderr and served.stderr == alone.stderr
    unknown = run(["no-such-command"], tmp_path, True)
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_a_killed_client_ends_its_fork(server, tmp_path):
    split = toy_split(tmp_path / "toy.json")
    params = {"env": {"L": 8, "H": 8}, "training": {"total_steps": 10_000_000, "eval_every": 5_000_000}}
    client = subprocess.Popen([*TAPEBENCH, *map(str, train_args("dqn", split, tmp_path / "long", params))],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not forks(server):
        assert time.monotonic() < deadline and client.poll() is None, "the command never started in a fork"
        time.sleep(0.05)
    running = forks(server)
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 20
    while any(pid in forks(server) for pid in running):
        assert time.monotonic() < deadline, "the fork outlived its killed client"
        time.sleep(0.05)


def test_without_a_server_the_command_runs_in_its_own_process(tmp_path):
    env = {**os.environ, SOCKET_VARIABLE: str(tmp_path / "no-server")}
    proc = subprocess.run([*TAPEBENCH, "methods"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "dqn" in proc.stdout


def test_the_server_ends_with_its_pipeline(tmp_path):
    """A server whose parent dies (a pipeline killed with SIGKILL) exits and removes its socket."""
    script = ("import time; from tapebench import jobserver; h = jobserver.start(log=print); "
              "print(h.process.pid, h.socket, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    while line.startswith("tapebench job server"):
        line = parent.stdout.readline()
    pid, socket_path = line.split()
    assert Path(socket_path).exists()
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the job server outlived its pipeline"
        time.sleep(0.1)
    assert not Path(socket_path).exists()


FORKED_JOB = """
import os, sys
import numba
from tapebench import jobserver

@numba.njit(parallel=True)
def thread_ids(n):
    ids = [0] * n
    for i in numba.prange(n):
        ids[i] = numba.get_thread_id()
    return ids

os.environ.pop("NUMBA_NUM_THREADS")   # the server imported numba on 2 threads; a job's environment replaces its own
os.environ.update({"NUMBA_NUM_THREADS": sys.argv[1]} if sys.argv[1] else {})
jobserver.numba_as_the_job()
print(numba.get_num_threads(), sorted(set(thread_ids(64))))
"""


@pytest.mark.parametrize("job_threads, expected", [("1", "1 [0]"), ("2", "2 [0, 1]"), ("", "2 [0, 1]")])
def test_a_fork_runs_numba_kernels_on_the_jobs_threads(job_threads, expected):
    """numba fixed its thread count when the server imported it: a job's NUMBA_NUM_THREADS=1 (a rule's, or
    OMP_NUM_THREADS as Snakemake sets it) must still give one thread, not the server's every core."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", FORKED_JOB, job_threads], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


@pytest.mark.parametrize("environ, expected", [
    ({"OMP_NUM_THREADS": "1"}, "1"),                              # Snakemake's, for a job of one thread
    ({"OMP_NUM_THREADS": "4", "NUMBA_NUM_THREADS": "2"}, "2"),    # a rule's own setting stands
    ({}, None), ({"OMP_NUM_THREADS": "0"}, None), ({"OMP_NUM_THREADS": "four"}, None)])
def test_a_command_runs_numba_on_the_threads_snakemake_gives_its_job(environ, expected):
    from tapebench.cli import numba_threads_of_the_job

    numba_threads_of_the_job(environ)
    assert environ.get("NUMBA_NUM_THREADS") == expected


def test_a_tapebench_process_takes_numba_threads_from_snakemakes_omp_setting(tmp_path):
    """`tapebench` as a job's own process (a cluster job, `execution.job_server: false`): numba, imported after the
    command line is read, starts on the job's threads."""
    script = ("from tapebench import cli; status = cli.main(['methods']); "
              "import numba.np.ufunc.parallel as parallel; print(status, parallel.NUM_THREADS)")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", SOCKET_VARIABLE)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 1"
