"""The python an xdist popen worker of a forked nested run starts as (tests/preload_server.py):
``python -I -S preload_worker.py SOCKET <interpreter args>``. It hands its standard streams to the
fork server, which forks the worker on them; this process waits for the worker and ends as it did.
Where the server refuses (another environment) or is gone, it becomes a fresh interpreter instead.
Standard library only: it starts in a few milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys


def main(socket_path: str, args: list[str]) -> None:
    """``python args`` for an xdist popen worker: forked by the server on this process's pipes, this
    process waiting for it and ending as it did; a fresh interpreter where the server refuses."""
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode() + b"\n"
    started = None
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(socket_path)
        socket.send_fds(connection, [request], [0, 1, 2])
        replies = connection.makefile("rb")
        started = json.loads(replies.readline() or b"{}").get("pid")
    except OSError:
        pass  # no server to ask: a fresh interpreter
    if started is None:
        os.execv(sys.executable, [sys.executable, *args])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # the worker holds its pipes: their ends close when it exits
        os.dup2(devnull, fd)
    os.close(devnull)
    code = json.loads(replies.readline() or b'{"returncode": 1}')["returncode"]
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
