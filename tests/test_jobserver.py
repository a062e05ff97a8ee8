"""The job server (docs/compute.md#job-server): a command run through it writes what the same command writes in its
own process, exit status and error messages included; a killed client ends its fork; without a server the command
runs in its own process; a server ends with its pipeline. (That the pipeline runs its local jobs through one: tests/test_pipeline.py.)"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from agent_contract import tensors_equal, toy_split, train_args
from pipeline_helpers import abstract_sockets, make_workdir, snakemake

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
    deadline = time.monotonic() + 60     # a loaded 2-core machine: 20 s failed twice in the full suite
    while any(pid in forks(server) for pid in running):
        assert time.monotonic() < deadline, "the fork outlived its killed client"
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["@tapebench-jobserver-none", "no-server"])
def test_without_a_server_the_command_runs_in_its_own_process(tmp_path, name):
    env = {**os.environ, SOCKET_VARIABLE: name if name.startswith("@") else str(tmp_path / name)}
    proc = subprocess.run([*TAPEBENCH, "methods"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "dqn" in proc.stdout


def alive(pid) -> bool:
    return Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def started_by_a_pipeline(tmp_path):
    """A stand-in pipeline (a process that started a server) with TMPDIR in `tmp_path`: (it, server pid, socket)."""
    script = ("import time; from tapebench import jobserver; h = jobserver.start(log=print); "
              "print(h.process.pid, h.socket, flush=True); time.sleep(600)")
    temp = tmp_path / "tmp"
    temp.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(temp)})
    line = parent.stdout.readline()
    while line.startswith("tapebench job server"):
        line = parent.stdout.readline()
    pid, name = line.split()
    return parent, int(pid), name


@pytest.mark.parametrize("killed", ["pipeline", "both"])
def test_no_kill_leaves_anything_behind(tmp_path, killed):
    """A server whose pipeline is killed with SIGKILL exits; whatever is killed, nothing of it stays: its socket is
    abstract (no file) and its log an unlinked file, so the temporary folder is empty throughout."""
    parent, pid, name = started_by_a_pipeline(tmp_path)
    assert name.startswith("@tapebench-jobserver-") and name in abstract_sockets()
    assert list((tmp_path / "tmp").iterdir()) == []
    if killed == "both":
        os.kill(pid, signal.SIGKILL)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while alive(pid):
        assert time.monotonic() < deadline, "the job server outlived its pipeline"
        time.sleep(0.1)
    while name in abstract_sockets():     # the kernel drops the socket once the last holder's files are closed
        assert time.monotonic() < deadline, f"the job server's socket {name} outlived it"
        time.sleep(0.1)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_connection_from_another_user_is_refused(monkeypatch):
    """An abstract socket has no file permissions: the server serves its own user's processes only."""
    from tapebench.utils.job_client import socket_address

    name = f"@tapebench-jobserver-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        listener.bind(socket_address(name))
        listener.listen(1)
        client.connect(socket_address(name))
        assert jobserver.peer_uid(listener.accept()[0]) == os.getuid()
        client2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client2.connect(socket_address(name))
        monkeypatch.setattr(jobserver.os, "getuid", lambda: os.geteuid() + 1)
        jobserver._accept(listener)               # no request read, no fork: the connection is closed
        assert client2.recv(1) == b""
        client2.close()


@pytest.mark.parametrize("facts, reason", [
    ({}, None),
    ({"enabled": False}, "execution.job_server is false"),
    ({"local": False}, "the jobs do not run on this machine"),
    ({"deployment": ["conda"]}, "software deployment method conda"),
    ({"deployment": ["apptainer", "conda"]}, "software deployment method apptainer, conda"),
    ({"deployment": ["env_modules"]}, "software deployment method env_modules"),
    ({"platform": "darwin"}, "the platform is darwin, not Linux"),
    ({"to_run": jobserver.MIN_JOBS - 1}, f"{jobserver.MIN_JOBS - 1} job(s) to run"),
])
def test_the_server_is_on_only_where_a_fork_is_the_jobs_own_process(facts, reason):
    run = {"enabled": True, "local": True, "deployment": [], "to_run": jobserver.MIN_JOBS, "platform": "linux",
           **facts}
    off = jobserver.why_off(**run)
    assert off == reason if reason is None else off.startswith(reason), off


PROBE = """
import json
from tapebench import jobserver

onstart:
    print("FACTS", json.dumps(jobserver.snakemake_run(workflow)), flush=True)

rule all:
    input: [f"out/{i}.txt" for i in range(9)]

rule one:
    output: "out/{i}.txt"
    shell: "echo {wildcards.i} > {output}"
"""


@pytest.mark.parametrize("args, facts", [
    ([], {"local": True, "deployment": [], "to_run": 10}),
    (["--sdm", "conda"], {"local": True, "deployment": ["conda"], "to_run": 10}),
    (["--sdm", "apptainer"], {"local": True, "deployment": ["apptainer"], "to_run": 10}),
    (["--sdm", "conda", "env-modules"], {"local": True, "deployment": ["conda", "env_modules"], "to_run": 10}),
])
def test_the_facts_come_from_the_installed_snakemake(tmp_path, args, facts):
    """`jobserver.snakemake_run` reads Snakemake's own attributes: on the installed release (pyproject.toml's range),
    a run's software deployment methods and the number of jobs it has to run are what its command line says."""
    (tmp_path / "Snakefile").write_text(PROBE)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    line = next((ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("FACTS ")), None)
    assert line is not None, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads(line[len("FACTS "):]) == facts


@pytest.mark.parametrize("args, started", [([], True), (["--sdm", "conda"], False)])
def test_the_pipeline_starts_a_server_only_without_a_deployment_method(tmp_path, args, started):
    """The workflow's own decision (common.smk), on the tiny protocol's Table 3 with `--touch` (no job runs): a local
    run forks its jobs from a server; under `--sdm conda` it says why it starts none (before the run needs conda, which
    a machine without it then reports)."""
    proc = snakemake(make_workdir(tmp_path), "results/table3.tex", "--touch", *args)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 or not started, output[-3000:]
    assert ("tapebench job server: jobs fork from process" in output) == started, output[-3000:]
    assert ("tapebench job server off: software deployment method conda" in output) == (not started), output[-3000:]


def test_pyproject_allows_the_tested_snakemake_range_only():
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[1]
    requirements = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    snakemake = next(Requirement(r) for r in requirements if Requirement(r).name == "snakemake")
    assert version("snakemake") in snakemake.specifier, (version("snakemake"), str(snakemake.specifier))
    assert "10.0" not in snakemake.specifier and "8.20" not in snakemake.specifier


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


def test_the_server_ends_a_fork_whose_client_is_gone():
    """The server's own check, which needs nothing of the fork (a fork whose main thread holds the interpreter's lock
    cannot run its watcher): a fork runs while its client lives and gets SIGTERM once the client is gone."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    fork, client = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    try:
        clients = {fork.pid: (client.pid, jobserver.process_start(client.pid))}
        assert isinstance(clients[fork.pid][1], int)
        jobserver._end_orphans(clients)
        assert fork.pid in clients and fork.poll() is None
        client.kill()
        client.wait()
        assert jobserver.process_start(client.pid) is None
        jobserver._end_orphans(clients)
        assert clients == {} and fork.wait(timeout=30) == -signal.SIGTERM
    finally:
        for process in (fork, client):
            process.kill()
            process.wait()
