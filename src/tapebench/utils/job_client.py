"""The `tapebench` command's side of the job server (docs/compute.md#job-server; the server: `tapebench.jobserver`).

With `SOCKET_VARIABLE` naming the socket of a running server (`socket_address`), `forward` hands the command line,
the working directory, the environment and the standard streams (file descriptors 0, 1, 2) to the server, which runs
the command in a fork of itself; this process waits for the command's exit status and exits with it. If this process
ends first (a job killed by the pipeline), the forked command is terminated. Without the variable, or when no server
answers before starting the command, `forward` returns None and the command runs in this process. Standard library
only: this module is imported on every `tapebench` start.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys

SOCKET_VARIABLE = "TAPEBENCH_JOBSERVER"
STARTED = b"S"                       # the server's first byte: the command is running in a fork
STATUS = struct.Struct("!i")         # then the command's exit status
LENGTH = struct.Struct("!I")         # a request: its length, then JSON {argv, cwd, env}
STREAMS = (0, 1, 2)


def socket_address(name: str) -> str:
    """The address of the server's socket named `name` in SOCKET_VARIABLE: "@NAME" is NAME in Linux's abstract socket
    namespace (no file, so nothing is left behind whatever kills the server), anything else a socket file's path."""
    return "\0" + name[1:] if name.startswith("@") else name


def receive_exactly(connection: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None when the peer closed the connection first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def forward(argv: list[str]) -> int | None:
    """The exit status of `argv` run by the job server, or None when there is no server to run it."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_address(path))
        request = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(connection, [LENGTH.pack(len(request))], list(STREAMS))
        connection.sendall(request)
        started = receive_exactly(connection, 1)
    except OSError:
        connection.close()
        return None
    with connection:
        if started != STARTED:
            return None
        status = receive_exactly(connection, STATUS.size)
    if status is None:
        print(f"tapebench: the job server's fork ended without an exit status (killed by a signal?); socket {path}",
              file=sys.stderr)
        return 1
    return STATUS.unpack(status)[0]
