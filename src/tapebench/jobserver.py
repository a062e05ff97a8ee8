"""The job server (docs/compute.md#job-server): a local pipeline run forks every `tapebench` job from one process
that has already imported what the commands import, instead of starting a new Python process per job. This module
is the server and the pipeline's start and stop of it; `tapebench.utils.job_client` is the command's side.

`python -m tapebench.jobserver --socket @NAME --parent PID --ready-fd FD` imports what `tapebench` commands import
(torch, numba with its compiled-kernel cache loaded, pandas, pyarrow, scipy, matplotlib on Agg, jinja2, every
command's module), then listens on the Unix socket NAME of Linux's abstract namespace (`job_client.socket_address`: no
file, so no kill leaves one behind; its log is an unlinked temporary file) and writes one byte to FD.
Each connection (`job_client.forward`) from a process of the server's own user brings a command line, a working
directory, an environment and three file descriptors; the server forks, and the fork takes them as its own (the
descriptors become 0, 1 and 2) and runs `tapebench.cli.main` on the command line, as a new `tapebench` process would,
and sends its exit status. A fork whose client disconnects first (the job was killed) terminates itself, and the
server ends it within POLL_S if it has not. The server exits when PID (the pipeline) is gone, or on SIGTERM.

`why_off` decides whether a pipeline run starts one (docs/compute.md#job-server): only where a job's command would run
as it does without it, i.e. a local run with no software deployment method, on Linux.

A fork starts from the server's state: modules imported, nothing else. Every command seeds its own random
streams, sets its own thread counts (numba's from the job's environment: `numba_as_the_job`) and reads no state a
previous job left (jobs run in forks, never in the server), so a job's outputs are those of the same command run on
its own (tested).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tapebench import cli
from tapebench.utils.job_client import (LENGTH, SOCKET_VARIABLE, STARTED, STATUS, STREAMS, receive_exactly,
                                        socket_address)

MIN_JOBS = 8   # fewer jobs to run: a process per job, as the server's imports (~3 CPU-s) would cost more than they save
READY_TIMEOUT_S = 120.0   # how long the pipeline waits for the server's imports before running jobs without it
POLL_S = 1.0              # how often the server checks that the pipeline is still there


def why_off(enabled: bool, local: bool, deployment: list[str], to_run: int, platform: str = sys.platform) -> str | None:
    """Why a pipeline run starts no job server, or None when it starts one. A job forked from the server runs in the
    server's interpreter with the server's imports, which is the job's own environment only for a local run (a cluster
    job runs elsewhere) with no software deployment method (conda, apptainer and environment modules each give a rule
    its own environment, which a fork would bypass); forking after importing torch and numba is safe on Linux only.
    With fewer than MIN_JOBS jobs to run the server's imports cost more than they save."""
    if not enabled:
        return "execution.job_server is false"
    if not platform.startswith("linux"):
        return f"the platform is {platform}, not Linux"
    if not local:
        return "the jobs do not run on this machine"
    if deployment:
        return (f"software deployment method {', '.join(deployment)}: every job starts its own process, in its rule's "
                f"environment")
    if to_run < MIN_JOBS:
        return f"{to_run} job(s) to run, fewer than {MIN_JOBS}"
    return None


def snakemake_run(workflow) -> dict:
    """`why_off`'s facts about a Snakemake run, read from the Snakefile's `workflow` object: whether its jobs run on this
    machine, its software deployment methods, how many jobs it has to run. These are Snakemake's attributes, not a
    documented interface: pyproject.toml allows the Snakemake releases tests/test_jobserver.py reads them from."""
    return {"local": bool(workflow.local_exec and not workflow.remote_exec),
            "deployment": sorted(m.name.lower() for m in workflow.deployment_settings.deployment_method),
            "to_run": sum(1 for _ in workflow.dag.needrun_jobs())}   # len(workflow.dag) counts finished jobs too


def preload() -> None:
    """Import what the commands import and load numba's compiled kernels once, so that forks skip both."""
    # lazy: the heavy imports are the server's work; the Snakefile imports this module for start and stop only
    import jinja2  # noqa: F401
    import matplotlib
    import numpy as np
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    from tapebench.ca.packed import popcount  # lazy: imports numba (heavy), as the forks' kernels do

    matplotlib.use("Agg")                     # what every figure builder selects; rcParams stay matplotlib's own
    import matplotlib.pyplot  # noqa: F401  # lazy: heavy, and only after the backend is chosen
    cli.build_parser()                        # every command's module
    popcount(np.uint64(1))                    # numba's CPU target and its cache: paid once, not per job


def numba_as_the_job() -> None:
    """numba as the job's environment sets it. numba read the NUMBA_* variables when the server imported it, and the
    thread count its parallel kernels launch was fixed then (every core, or the server's NUMBA_NUM_THREADS): a job's
    NUMBA_NUM_THREADS becomes numba's thread count here, where it is fewer, so that a one-thread job runs its
    kernels on one thread as a process of its own would."""
    numba = sys.modules.get("numba")
    if numba is None:
        return
    launched = numba.config.NUMBA_NUM_THREADS
    numba.config.reload_config()
    if numba.config.NUMBA_NUM_THREADS < launched:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def _run_fork(connection: socket.socket, request: dict, streams: list[int]) -> None:
    """In the fork: become the requesting command and run it; never returns."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({k: v for k, v in request["env"].items() if k != SOCKET_VARIABLE})
    numba_as_the_job()
    for target, descriptor in zip(STREAMS, streams):
        os.dup2(descriptor, target)
        os.close(descriptor)
    sys.argv = ["tapebench", *request["argv"]]
    connection.sendall(STARTED)

    def end_with_client() -> None:            # the client closes the connection only when it is killed
        connection.recv(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=end_with_client, daemon=True).start()
    try:
        status = cli.main(request["argv"])
    except SystemExit as exc:                 # argparse's errors, sys.exit(...): as the interpreter ends a process
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:                     # noqa: BLE001 - a fork reports every failure as a new process would
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        connection.sendall(STATUS.pack(int(status)))
    finally:
        os._exit(int(status) & 0xFF)


_CREDENTIALS = struct.Struct("3i")     # struct ucred: pid, uid, gid


def _peer(connection: socket.socket) -> tuple[int, int]:
    """(pid, user id) of the process at the other end of a Unix socket (the kernel's SO_PEERCRED)."""
    pid, uid, _ = _CREDENTIALS.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            _CREDENTIALS.size))
    return pid, uid


def peer_uid(connection: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    return _peer(connection)[1]


def process_start(pid: int) -> int | None:
    """A live process's start time (clock ticks after boot, field 22 of /proc/PID/stat), which tells it from a later
    process given the same pid; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()      # the fields after the command name, from field 3 (the state)
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _accept(listener: socket.socket) -> tuple[int, int, int | None] | None:
    """Serve one connection: (the fork's pid, its client's pid, that process's start time), or None."""
    connection, _ = listener.accept()
    streams: list[int] = []
    try:
        client, uid = _peer(connection)
        if uid != os.getuid():                 # an abstract socket has no file permissions: only our own user
            return None
        head, streams, _, _ = socket.recv_fds(connection, LENGTH.size, len(STREAMS))
        rest = receive_exactly(connection, LENGTH.size - len(head)) if len(head) < LENGTH.size else b""
        if rest is None or len(streams) != len(STREAMS):
            return None
        body = receive_exactly(connection, LENGTH.unpack(head + rest)[0])
        if body is None:
            return None
        request = json.loads(body)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            _run_fork(connection, request, streams)
        return pid, client, process_start(client)
    finally:
        connection.close()
        for descriptor in streams:
            os.close(descriptor)


def _end_orphans(clients: dict[int, tuple[int, int]]) -> None:
    """SIGTERM each fork whose client is gone. The fork's own watcher usually ends it first, but it runs Python, so a
    fork whose main thread holds the interpreter's lock (a long native call) would outlive its killed client."""
    for pid, (client, started) in list(clients.items()):
        if process_start(client) != started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)   # an unreaped child of this process: the pid is still the fork's
            del clients[pid]


def _reap() -> list[int]:
    """The forks that ended since the last call (collected, so no zombie stays)."""
    ended = []
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid <= 0:
                return ended
            ended.append(pid)
    except ChildProcessError:
        return ended


def serve(name: str, parent: int, ready_fd: int) -> None:
    """Preload, then run forks for connections on the socket `name` (`job_client.socket_address`) until `parent` is
    gone or SIGTERM; one byte on `ready_fd` once it accepts."""
    preload()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_address(name))
    listener.listen(128)
    os.write(ready_fd, b"R")
    os.close(ready_fd)
    clients: dict[int, tuple[int, int]] = {}      # fork pid -> (its client's pid, that process's start time)
    try:
        while os.getppid() == parent:
            readable, _, _ = select.select([listener], [], [], POLL_S)
            _end_orphans(clients)
            for pid in _reap():
                clients.pop(pid, None)
            if readable:
                forked = _accept(listener)
                if forked is not None:
                    pid, client, started = forked
                    if started is not None:    # a client this process cannot see is left to the fork's own watcher
                        clients[pid] = (client, started)
    finally:
        listener.close()
        if not name.startswith("@"):
            Path(name).unlink(missing_ok=True)


@dataclass
class Handle:
    """A started server: its process, its socket's name (SOCKET_VARIABLE) and its log (an unlinked file)."""

    process: subprocess.Popen
    socket: str
    log: object


def start(log=print) -> Handle | None:
    """Start a server for this process's jobs and point them at it (`SOCKET_VARIABLE` in this environment); None
    when it is not ready within READY_TIMEOUT_S (jobs then start their own processes, as without a server). Nothing of
    it is on disk: the socket is abstract, the log an unlinked temporary file (shown here if the server fails)."""
    name = f"@tapebench-jobserver-{os.getpid()}-{secrets.token_hex(8)}"
    server_log = tempfile.TemporaryFile()
    ready, ready_w = os.pipe()
    try:
        handle = Handle(subprocess.Popen([sys.executable, "-m", "tapebench.jobserver", "--socket", name, "--parent",
                                          str(os.getpid()), "--ready-fd", str(ready_w)],
                                         stdin=subprocess.DEVNULL, stdout=server_log, stderr=server_log,
                                         pass_fds=(ready_w,), start_new_session=True), name, server_log)
    finally:
        os.close(ready_w)
    try:
        answered, _, _ = select.select([ready], [], [], READY_TIMEOUT_S)
        started = bool(answered) and os.read(ready, 1) == b"R"
    finally:
        os.close(ready)
    if not started:
        server_log.seek(0)
        tail = server_log.read().decode(errors="replace").strip().splitlines()[-5:]
        log("tapebench job server did not start" + (": " + " | ".join(tail) if tail else "") +
            "; every job starts its own process")
        stop(handle)
        return None
    os.environ[SOCKET_VARIABLE] = name
    log(f"tapebench job server: jobs fork from process {handle.process.pid} ({name})")
    return handle


def stop(handle: Handle | None) -> None:
    """Stop the server; jobs started later run in their own processes."""
    if handle is None:
        return
    if os.environ.get(SOCKET_VARIABLE) == handle.socket:
        del os.environ[SOCKET_VARIABLE]
    if handle.process.poll() is None:
        handle.process.terminate()
        try:
            handle.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            handle.process.kill()
            handle.process.wait()
    handle.log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tapebench.jobserver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on: @NAME (abstract) or a path")
    parser.add_argument("--parent", required=True, type=int, help="serve while this process id is the parent")
    parser.add_argument("--ready-fd", required=True, type=int, help="write one byte to this descriptor when ready")
    args = parser.parse_args(argv)
    serve(args.socket, args.parent, args.ready_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
