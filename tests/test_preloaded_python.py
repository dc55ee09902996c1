"""The nested runs' fork servers answer as a fresh ``python -m`` would: the same working directory,
environment, module path, arguments, output and exit code; an environment the preload reads (a kernel
selection) gets a server started in it; a run past its time limit is stopped without taking the server down."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests import preloaded_python

PROBE = """
import json, os, sys
import torch
print(json.dumps({"cwd": os.getcwd(), "marker": os.environ.get("WRAPQ_PROBE"), "path": sys.path,
                  "argv": sys.argv[1:], "main": __name__, "kernels": torch.backends.cpu.get_cpu_capability()}))
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
    if kernels:
        env["ATEN_CPU_CAPABILITY"] = kernels
    assert preloaded_python._server_for(env) is not None, "no fork server started on this machine"
    forked = preloaded_python.run(command, cwd=probe_dir, env=env, capture_output=True, text=True, timeout=120)
    fresh = subprocess.run(command, cwd=probe_dir, env=env, capture_output=True, text=True, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 3 and '"marker": "seen"' in forked.stdout
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
