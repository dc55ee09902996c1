"""``python -m <module> <args>`` for the harness tests' nested runs, started from a fork server that has
the heavy third-party libraries imported already (tests/preload_server.py): a nested harness run
spends about four seconds importing torch, transformers and the model modules before it does anything,
and the tests start over a hundred of them.

Each environment, up to the variables read only when a run starts (``preload_server._LATE_READ``), gets its
own server started in it: a kernel selection or a hash seed is in place before the preload imports, as in a
fresh interpreter. A nested ``pytest -n N`` gets its xdist workers forked by the same server. A request runs as
a plain subprocess instead when it asks for more than one OpenMP thread, or when its server cannot start or is
not single-threaded: the answer is the same either way, only the time differs.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.preload_server import SERVER_ONLY, preload_env, servable

_SERVER_SCRIPT = Path(__file__).with_name("preload_server.py")
_REPO = Path(__file__).resolve().parents[1]
# Each server holds torch and transformers in memory (about half a GB): at most this many, the least
# recently used one stopped to make room for another environment's.
_MAX_SERVERS = 3


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, str(_SERVER_SCRIPT)],
            cwd=_SERVER_SCRIPT.parent,
            env=self.env | SERVER_ONLY,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._pending = b""
        try:
            ready = self._read(timeout=300)
        except RuntimeError:
            ready = None
        self.usable = bool(ready and ready.get("ready"))
        self.workers_socket = ready.get("workers") if self.usable else None  # where its xdist workers ask

    def _read(self, timeout: float | None) -> dict | None:
        """The server's next JSON line; None when it does not come within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the preload fork server ended (exit {self.process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def alive(self) -> bool:
        return self.usable and self.process.poll() is None

    def run(self, request: dict, timeout: float | None) -> int | None:
        """The child's exit code; None when it ran past ``timeout`` (it and what it started are killed)."""
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        started = self._read(timeout=60)
        if started is None:
            self.usable = False
            raise RuntimeError("the preload fork server did not start the run")
        done = self._read(timeout)
        if done is None:
            try:
                os.killpg(started["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._read(timeout=60)
            return None
        return done["returncode"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


_servers: dict[frozenset, _Server] = {}  # least recently used first


def _server_for(env: dict[str, str]) -> _Server | None:
    if not servable(env):
        return None
    preloaded = preload_env(env)
    key = frozenset(preloaded.items())
    server = _servers.pop(key, None)
    if server is None:
        if len(_servers) >= _MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
        server = _Server(preloaded)
        atexit.register(server.close)
    _servers[key] = server
    return server if server.alive() else None


_bytecode_written = False
_BYTECODE_RUN = "cases/nn.py::nn_linear[tiny]"  # every check of a leaf case: nearly every harness module


def _write_project_bytecode(server: _Server, env: dict[str, str]) -> None:
    """pytest rewrites the asserts of the harness package (the distribution of a pytest11 plugin) at every
    import it cannot read back from __pycache__: about 0.25 s in each nested process where
    PYTHONDONTWRITEBYTECODE is set, as on this project's CI machine. One small run of the project's own cases
    that may write bytecode leaves the harness's and the cases' compiled modules for the others to read; the
    tests' temporary case and tico trees are never written (an edit there may keep a file's size and second)."""
    global _bytecode_written
    _bytecode_written = True
    with tempfile.TemporaryDirectory(prefix="bytecode-") as scratch:
        # the server's own environment (no PYTHONPATH, WRAPQ_TICO or plugin of the request): the installed tico
        plain = server.env | {k: env[k] for k in ("HOME",) if k in env}
        request = {"module": "pytest", "env": plain}
        request["args"] = ["-q", "-p", "no:cacheprovider", f"--wrapq-report-dir={scratch}", _BYTECODE_RUN]
        request |= {"cwd": str(_REPO), "stdout": f"{scratch}/stdout", "stderr": f"{scratch}/stderr"}
        server.run(request, timeout=600)


def run(
    command: list[str],
    *,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, ...)`` for a ``[sys.executable, "-m", module, *args]`` command whose output
    is captured as text; the same result, from a preloaded fork where the environment allows."""
    if command[:2] != [sys.executable, "-m"] or len(command) < 3 or not (capture_output and text):
        raise ValueError("preloaded_python.run takes [sys.executable, '-m', module, ...] with captured text output")
    env = dict(os.environ if env is None else env)
    server = _server_for(env)
    if server is not None and env.get("PYTHONDONTWRITEBYTECODE") and not _bytecode_written:
        _write_project_bytecode(server, env)
    if server is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    command = [str(part) for part in command]
    with tempfile.TemporaryDirectory(prefix="nested-run-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        request = {"module": command[2], "args": command[3:], "env": env}
        request |= {"cwd": str(Path(cwd or os.getcwd()).resolve()), "stdout": str(out), "stderr": str(err)}
        returncode = server.run(request, timeout)
        if returncode is None:
            raise subprocess.TimeoutExpired(command, timeout)
        return subprocess.CompletedProcess(command, returncode, out.read_text(), err.read_text())


def runpytest(pytester: pytest.Pytester, *args: Any, timeout: float | None = None) -> pytest.RunResult:
    """``pytester.runpytest_subprocess(*args)``: the same arguments (a fresh ``--basetemp``, the
    pytester's plugins by name) and environment (its directory put first on PYTHONPATH)."""
    basetemp = tempfile.mkdtemp(prefix="runpytest-", dir=pytester.path)
    full = [f"--basetemp={basetemp}", *map(str, args)]
    for plugin in pytester.plugins:
        full = ["-p", str(plugin), *full]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", *full]
    done = run(command, cwd=os.getcwd(), env=env, capture_output=True, text=True, timeout=timeout)
    return pytest.RunResult(
        done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), time.monotonic() - started
    )
