"""The nested runs' fork servers answer as a fresh ``python -m`` would: the same working directory,
environment, module path, arguments, output and exit code; an environment the preload reads (a kernel
selection) gets a server started in it; a run past its time limit is stopped without taking the server down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import preloaded_python

PROBE = """
import json, os, sys
import torch
print(json.dumps({"cwd": os.getcwd(), "marker": os.environ.get("WRAPQ_PROBE"), "path": sys.path,
                  "argv": sys.argv[1:], "main": __name__, "kernels": torch.backends.cpu.get_cpu_capability(),
                  "writes_bytecode": not sys.dont_write_bytecode}))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["sleep"]:
    import time
    time.sleep(60)
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""


@pytest.fixture
def probe_dir(tmp_path):
    (tmp_path / "wrapq_probe.py").write_text(textwrap.dedent(PROBE))
    return tmp_path


@pytest.mark.parametrize("kernels", [None, "default"], ids=["as_installed", "scalar_kernels"])
def test_a_forked_run_matches_a_fresh_interpreter(probe_dir, kernels):
    command = [sys.executable, "-m", "wrapq_probe", "one", "3"]
    env = {**os.environ, "WRAPQ_PROBE": "seen", "PYTHONPATH": str(probe_dir / "extra")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if kernels:  # and bytecode writing off, which a server's children may differ in
        env |= {"ATEN_CPU_CAPABILITY": kernels, "PYTHONDONTWRITEBYTECODE": "1"}
    assert preloaded_python._server_for(env) is not None, "no fork server started on this machine"
    forked = preloaded_python.run(command, cwd=probe_dir, env=env, capture_output=True, text=True, timeout=120)
    fresh = subprocess.run(command, cwd=probe_dir, env=env, capture_output=True, text=True, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 3 and '"marker": "seen"' in forked.stdout
    assert f'"writes_bytecode": {"false" if kernels else "true"}' in forked.stdout
    if kernels:  # the selection was in place when the server imported torch
        assert '"kernels": "DEFAULT"' in forked.stdout, forked.stdout


def test_each_preloaded_environment_has_its_own_server_and_more_threads_run_as_a_subprocess():
    plain = preloaded_python._server_for(dict(os.environ))
    scalar = preloaded_python._server_for({**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert plain is not None and scalar is not None and plain is not scalar
    assert preloaded_python._server_for({**os.environ, "WRAPQ_TICO": "/elsewhere", "CI": "true"}) is plain
    assert preloaded_python._server_for({**os.environ, "OMP_NUM_THREADS": "4"}) is None


def test_a_run_past_its_limit_is_stopped_and_the_next_one_still_runs(probe_dir):
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded_python.run(
            [sys.executable, "-m", "wrapq_probe", "sleep"], cwd=probe_dir, capture_output=True, text=True, timeout=2
        )
    again = preloaded_python.run(
        [sys.executable, "-m", "wrapq_probe", "0"], cwd=probe_dir, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and '"argv": ["0"]' in again.stdout


def test_a_new_environment_past_the_limit_stops_the_least_recently_used_server(monkeypatch):
    monkeypatch.setattr(preloaded_python, "_MAX_SERVERS", 1)
    monkeypatch.setattr(preloaded_python, "_servers", {})
    plain = preloaded_python._server_for(dict(os.environ))
    scalar = preloaded_python._server_for({**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert scalar is not None and scalar.alive()
    assert plain.process.wait(timeout=60) == 0 and list(preloaded_python._servers.values()) == [scalar]
    scalar.close()


XDIST_CONFTEST = """
import json, os
from pathlib import Path

def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: its pid, and a kernel selection if asked
        Path("controller.json").write_text(json.dumps(os.getpid()))
        if os.environ.get("WRAPQ_PROBE_KERNELS"):
            os.environ["ATEN_CPU_CAPABILITY"] = os.environ["WRAPQ_PROBE_KERNELS"]
"""

XDIST_TESTS = """
import json, os, sys, time
from pathlib import Path
import torch

def _record(name):
    Path(f"{name}-{os.environ['PYTEST_XDIST_WORKER']}.json").write_text(json.dumps({
        "ppid": os.getppid(), "pid": os.getpid(), "path": sys.path, "cwd": os.getcwd(),
        "argv": sys.argv, "kernels": torch.backends.cpu.get_cpu_capability(),
        "main_spec": sys.modules["__main__"].__spec__ is None, "unbuffered": sys.stdout.write_through,
    }))

def test_records_its_process():
    _record("record")

def test_fails():
    assert 1 == 2

def test_dies():
    os._exit(3)

def test_hangs():
    import subprocess
    sleeper = subprocess.Popen(["sleep", "300"])  # what the worker started: it goes with the run too
    _record("hang")
    Path("sleeper.json").write_text(json.dumps(sleeper.pid))
    time.sleep(300)
"""


@pytest.fixture
def xdist_project(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(XDIST_CONFTEST))
    (tmp_path / "test_workers.py").write_text(textwrap.dedent(XDIST_TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider -p no:harness.plugin\n")
    return tmp_path


def _xdist_run(project, runner, selection="not hangs", timeout=300, **env):
    for stale in project.glob("*.json"):
        stale.unlink()
    command = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-k", selection]
    done = runner(command, cwd=project, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    records = [json.loads(p.read_text()) for p in sorted(project.glob("record-*.json"))]
    return done, json.loads((project / "controller.json").read_text()), records


def _summary(done) -> str:
    return re.sub(r" in [\d.]+s.*", "", done.stdout.strip().splitlines()[-1])


def test_a_forked_nested_xdist_run_forks_its_workers_and_answers_as_a_fresh_one(xdist_project):
    fresh, fresh_controller, (fresh_worker,) = _xdist_run(xdist_project, subprocess.run)
    forked, forked_controller, (forked_worker,) = _xdist_run(xdist_project, preloaded_python.run)
    assert fresh_worker["ppid"] == fresh_controller  # execnet's own popen worker
    assert forked_worker["ppid"] != forked_controller  # forked by the server, not started by the run
    for record in (fresh_worker, forked_worker):
        del record["ppid"], record["pid"]
    assert forked_worker == fresh_worker  # the same module path, directory, arguments, kernels, streams
    # the same outcomes, a crashed worker replaced in both
    assert (forked.returncode, _summary(forked)) == (fresh.returncode, _summary(fresh)) == (1, "2 failed, 1 passed")
    assert re.search(r"worker 'gw\d' crashed while running 'test_workers.py::test_dies'", forked.stdout)


def test_a_worker_in_another_environment_starts_fresh(xdist_project):
    """The run's controller sets a kernel selection before its workers start: the server imported torch
    without it, so the workers start as fresh interpreters, which read it."""
    _, controller, (worker,) = _xdist_run(xdist_project, preloaded_python.run, "records", WRAPQ_PROBE_KERNELS="default")
    assert worker["ppid"] == controller and worker["kernels"] == "DEFAULT"


def test_a_broken_worker_request_leaves_the_server_serving(probe_dir):
    import socket

    server = preloaded_python._server_for(dict(os.environ))
    for payload in (b"", b"not json\n", b'{"args": ["-c", "pass"]}\n'):  # no streams passed with the last
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(server.workers_socket)
            connection.sendall(payload)
            connection.shutdown(socket.SHUT_WR)
            assert connection.recv(100) in (b"", b'{"refused": true}\n')
    done = preloaded_python.run(
        [sys.executable, "-m", "wrapq_probe", "0"], cwd=probe_dir, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and server.alive()


def _gone(pid: int) -> bool:
    """No such process, or one that exited and awaits its parent's reaping."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_nested_run_stopped_at_its_limit_takes_its_forked_workers_with_it(xdist_project):
    with pytest.raises(subprocess.TimeoutExpired):
        _xdist_run(xdist_project, preloaded_python.run, "hangs", timeout=10)
    records = [json.loads(p.read_text()) for p in xdist_project.glob("hang-*.json")]
    assert len(records) == 1, "the hanging test had not started when the run's 10 s were up"
    hung = records[0]
    sleeper = json.loads((xdist_project / "sleeper.json").read_text())
    deadline = time.monotonic() + 30
    while not (_gone(hung["pid"]) and _gone(sleeper)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(hung["pid"]), "the forked worker outlived the run that started it"
    assert _gone(sleeper), "a process the forked worker started outlived the run"
