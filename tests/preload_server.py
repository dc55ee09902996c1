"""Fork server for the harness tests' nested runs (tests/preloaded_python.py is its client).

Run as a script, without PYTHONPATH: it imports the third-party libraries every nested harness run
imports (torch, transformers and the Hugging Face model modules the cases build, torch.export's
tracer), then forks one child per request. The child takes the request's working directory,
environment, ``sys.path`` and ``sys.argv`` and runs ``python -m <module> <args>`` from there, so it
differs from a fresh interpreter only in having those libraries imported already. Nothing of this
project (tico, harness, cases, tests) is imported before the fork: a run on a tico copy imports
that copy. Protocol: one JSON line per request on stdin; JSON lines back on stdout.

A nested ``pytest -n N`` gets its xdist workers from the same server: the run's popen workers start
tests/preload_worker.py as their python, which hands the worker's pipes to the server over a Unix
socket and waits; the server forks the worker as ``python -c <bootstrap>`` on those pipes.
A worker whose environment is not the one the server preloaded in starts as a fresh interpreter.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import io
import json
import os
import runpy
import selectors
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import traceback
import types

PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.export",
    "torch.fx.experimental.symbolic_shapes",
    "sympy",
    "numpy",
    "transformers",
    "transformers.cache_utils",
    "transformers.models.gemma4.modeling_gemma4",
    "transformers.models.gemma4_assistant.modeling_gemma4_assistant",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3_vl.modeling_qwen3_vl",
    "safetensors.torch",
    "jinja2",
    # what tico and the harness import from outside them, and pytest's own modules (not its plugins:
    # a plugin imported before pytest starts is not assertion-rewritten)
    "circle_schema",
    "flatbuffers",
    "torch.ao.quantization.fx",
    "torch.ao.quantization.fx._decomposed",
    "coverage",
    "tabulate",
    "execnet",
    "pygments.lexers.python",
    "pytest",
    "_pytest.pytester",
)
# transformers imports anyio, which is also a pytest plugin: pytest cannot rewrite the asserts of a plugin
# imported before it starts, and says so in a config-time warning that a fresh interpreter does not print
# (only pytest's own -W option reaches that warning).
_PRELOADED_PLUGIN_WARNING = (
    "-W",
    "ignore:Module already imported so cannot be rewritten; anyio:pytest.PytestAssertRewriteWarning",
)

# Variables read when a run starts (by pytest, the harness, the case's tico), never by the preloaded
# libraries' imports, so a request may set them to anything.
_LATE_READ_PREFIXES = ("PYTEST_", "WRAPQ_")
_LATE_READ = {"PYTHONPATH", "HOME", "USERPROFILE", "CI", "NO_COLOR", "FORCE_COLOR", "PY_COLORS", "COLUMNS", "LINES"}
_LATE_READ |= {"NO_MKDOCS_2_WARNING", "PWD", "OLDPWD", "_"}
# torch sets these itself the first time a test compiles or exports, and reads them only when it needs them.
_LATE_READ |= {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
# Read by the interpreter at start; a child applies it itself (sys.dont_write_bytecode), as a fresh one would.
_LATE_READ |= {"PYTHONDONTWRITEBYTECODE"}
# The server imports torch with one OpenMP thread: with torch's default (one per core) the import starts
# a worker thread, and a process with threads must not fork. Every nested harness run sets one intra-op
# thread itself (--torch-threads), so only a request that asks for another count runs as a subprocess.
SERVER_ONLY = {"OMP_NUM_THREADS": "1"}
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preload_worker.py")
# The interpreter options execnet starts a popen worker with; any other makes the worker a fresh one.
_WORKER_FLAGS = {"-u", "-B"}


def preload_env(env: dict[str, str]) -> dict[str, str]:
    """What of ``env`` the preload imports may read."""
    late = lambda name: name in _LATE_READ or name.startswith(_LATE_READ_PREFIXES)  # noqa: E731
    return {k: v for k, v in env.items() if not late(k) and k not in SERVER_ONLY}


def servable(env: dict[str, str]) -> bool:
    """Whether a server may run a request with ``env`` at all (see SERVER_ONLY)."""
    return all(env.get(k, v) == v for k, v in SERVER_ONLY.items())


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _thread_count() -> int:
    """Threads of this process, native ones included: forking is only safe with one."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: the client then runs every request as a plain subprocess


def _enter(request: dict, base_path: list[str], first_path: str, stdio: list[int]) -> None:
    """In a forked child: the request's process group, standard streams, directory, environment and path."""
    os.setpgid(0, 0)  # the client (or the server, for a worker) stops the child and what it started as one group
    for fd, source in enumerate(stdio):
        os.dup2(source, fd)  # replaces the server's request and reply pipes in the child
        os.close(source)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    extra = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first_path, *extra, *base_path]
    importlib.invalidate_caches()


def _finish(code: object) -> None:
    """Ends the process through normal interpreter shutdown (atexit handlers run, as in a fresh one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _run_module(request: dict, base_path: list[str], worker_python: str) -> None:
    """In the forked child: become ``python -m module args`` in the request's directory and environment."""
    stdio = [
        os.open(os.devnull, os.O_RDONLY),
        os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    _enter(request, base_path, os.path.abspath(request["cwd"]), stdio)
    code: object = 0
    try:
        if request["module"] == "pytest":  # `python -m pytest`, with its xdist workers forked here too
            import pytest

            main = importlib.util.module_from_spec(importlib.util.find_spec("pytest.__main__"))
            main.__name__ = "__main__"
            sys.modules["__main__"] = main
            sys.argv = [main.__file__, *_PRELOADED_PLUGIN_WARNING, *request["args"]]
            code = pytest.main(plugins=[_forked_workers(worker_python)])
        else:
            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would, on stderr with exit 1
        traceback.print_exc()
        code = 1
    _finish(code)


def _run_worker(request: dict, base_path: list[str], stdio: list[int]) -> None:
    """In the forked child: become ``python [-u] [-B] -c code args`` on the worker's own pipes."""
    _enter(request, base_path, "", stdio)
    flags, code_text, sys.argv = _worker_command(request["args"])
    sys.dont_write_bytecode = sys.dont_write_bytecode or "-B" in flags
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, as a fresh interpreter has it
    unbuffered = "-u" in flags  # execnet's: writes go straight to the pipe
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), write_through=unbuffered)
        setattr(sys, name, stream)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code: object = 0
    try:
        exec(compile(code_text, "<string>", "exec"), main.__dict__)  # noqa: S102 - what `python -c` runs
    except SystemExit as done:
        code = done.code
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    _finish(code)


def _forked_workers(python: str) -> object:
    """pytest plugin for a forked ``pytest -n N``: its popen workers start through this server."""
    import pytest

    class ForkedWorkers:
        @pytest.hookimpl(optionalhook=True)  # a run without xdist has no such hook
        def pytest_xdist_setupnodes(self, config, specs) -> None:  # noqa: ARG002 - xdist's hook signature
            for spec in specs:
                if spec.popen and not spec.python and not spec.via:
                    spec.python = python

    return ForkedWorkers()


def _worker_command(args: list[str]) -> tuple[set[str], str, list[str]] | None:
    """execnet's popen command line, ``[-u] [-B] -c code args``: (options, code, ``sys.argv``); None for another."""
    flags = set()
    while args and args[0] in _WORKER_FLAGS:
        flags.add(args[0])
        args = args[1:]
    if len(args) < 2 or args[0] != "-c":
        return None
    return flags, args[1], ["-c", *args[2:]]


def _worker_request_ok(request: dict, env: dict[str, str], fds: list[int]) -> bool:
    """Whether a popen worker's request is one to fork: its three streams, execnet's own command line
    and the environment the server preloaded in."""
    if len(fds) != 3 or not servable(request.get("env", {})) or preload_env(request.get("env", {})) != env:
        return False
    return _worker_command(request.get("args", [])) is not None


class _Server:
    """One loop over the client's requests (stdin), worker connections (the socket) and children's exits."""

    def __init__(self, base_path: list[str]) -> None:
        self.base_path = base_path
        self.pid = os.getpid()
        self.env = preload_env(dict(os.environ))
        self.directory = tempfile.mkdtemp(prefix="wrapq-preload-")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(os.path.join(self.directory, "workers"))
        self.listener.listen(16)
        self.worker_python = shlex.join([sys.executable, "-I", "-S", _WORKER_SCRIPT, self.listener.getsockname()])
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_write, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "request")
        self.selector.register(self.listener, selectors.EVENT_READ, "worker")
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, "exited")
        self.pending = b""
        self.run_pid: int | None = None
        self.workers: dict[int, socket.socket] = {}  # worker pid -> the connection of the process waiting on it

    def _fork(self) -> int:
        pid = os.fork()
        if pid == 0:  # nothing of the server's loop goes on in a child
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            for fd in (self.wakeup_read, self.wakeup_write, self.listener.fileno()):
                os.close(fd)
            for connection in self.workers.values():
                connection.close()
        return pid

    def _start_run(self, request: dict) -> None:
        pid = self._fork()
        if pid == 0:
            _run_module(request, self.base_path, self.worker_python)
        self.run_pid = pid
        _reply({"pid": pid})

    def _start_worker(self) -> None:
        connection, _ = self.listener.accept()
        fds: list[int] = []
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
            while message and not message.endswith(b"\n"):
                chunk = connection.recv(1 << 16)
                message += chunk if chunk else b"\n"
            request = json.loads(message or b"{}")
            if not _worker_request_ok(request, self.env, fds):
                connection.sendall(b'{"refused": true}\n')  # the waiting process starts a fresh interpreter
                raise ValueError("refused")
        except (OSError, ValueError):  # refused, or the waiting process went away or sent nonsense
            for fd in fds:
                os.close(fd)
            connection.close()
            return
        pid = self._fork()
        if pid == 0:
            _run_worker(request, self.base_path, fds)
        for fd in fds:
            os.close(fd)  # the worker's pipes end when it does, not when the server does
        self.workers[pid] = connection
        self.selector.register(connection, selectors.EVENT_READ, pid)
        try:
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            self._stop_worker(pid, connection)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            if pid == self.run_pid:
                self.run_pid = None
                _reply({"returncode": code})
            elif pid in self.workers:  # a stopped worker is no longer listed: nobody waits for it
                connection = self.workers.pop(pid)
                self.selector.unregister(connection)
                try:
                    connection.sendall(json.dumps({"returncode": code}).encode() + b"\n")
                except OSError:
                    pass  # the waiting process is gone
                connection.close()

    def _stop_worker(self, pid: int, connection: socket.socket) -> None:
        """The process waiting on this worker is gone: the worker (and what it started) goes too."""
        del self.workers[pid]
        self.selector.unregister(connection)
        connection.close()
        for kill in (os.killpg, os.kill):  # the group, and the worker itself should it not have made one yet
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup descriptor is what the loop watches
        try:
            while True:
                for key, _ in self.selector.select():
                    if isinstance(key.fileobj, socket.socket) and key.fileobj.fileno() < 0:
                        continue  # a worker's connection closed earlier in this round
                    if key.data == "request":
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            return  # the client closed its end
                        self.pending += chunk
                        while b"\n" in self.pending:
                            line, self.pending = self.pending.split(b"\n", 1)
                            self._start_run(json.loads(line))
                    elif key.data == "worker":
                        self._start_worker()
                    elif key.data == "exited":
                        os.read(self.wakeup_read, 4096)
                        self._reap()
                    elif not key.fileobj.recv(1):
                        self._stop_worker(key.data, key.fileobj)
        finally:
            if os.getpid() == self.pid:  # a child's exit unwinds through here too
                shutil.rmtree(self.directory, ignore_errors=True)


def main() -> None:
    base_path = sys.path[1:]  # a fresh `python -m` puts its directory first, then what this one has
    sys.path[:] = base_path  # this script's directory (tests/) never shadows a library the preload imports
    for name in PRELOAD:
        importlib.import_module(name)
    threads = _thread_count()
    if threads != 1:
        _reply({"ready": False, "threads": threads})
        return
    server = _Server(base_path)
    _reply({"ready": True, "threads": threads, "workers": server.listener.getsockname()})
    # The preloaded objects live as long as any child: the children's collector then neither walks them
    # nor touches (and so copies) their pages, which halved a child's run and exit.
    gc.freeze()
    server.serve()


if __name__ == "__main__":
    main()
