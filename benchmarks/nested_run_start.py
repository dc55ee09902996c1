"""A nested harness run as the harness tests start one: a fresh interpreter against a fork of the
preloaded server (tests/preloaded_python.py), side by side in one process, alternating.

    ./scripts/env.sh python benchmarks/nested_run_start.py [--reps 3] [--selection NODEID] [--workers N]

Each rep runs the selection (default: nn_linear's tiny group, every check, caches off) once each way and
checks both give the same exit code and closing line. ``--workers N`` runs it as ``pytest -n N``: the
forked run's xdist workers are forked from the server too. Prints the medians and their ratio; the
server's own start is timed once, apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import preloaded_python  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--selection", default="cases/nn.py::nn_linear[tiny]")
    parser.add_argument("--workers", type=int, default=0, help="xdist workers of each run (0: none)")
    options = parser.parse_args()
    env = dict(os.environ)
    started = time.monotonic()
    if preloaded_python._server_for(env) is None:
        print("no fork server could start here: every nested run would be a plain subprocess")
        return 1
    print(f"fork server start (once per environment and test worker): {time.monotonic() - started:.1f} s")
    runners = {"fresh interpreter": subprocess.run, "forked from the server": preloaded_python.run}
    times: dict[str, list[float]] = {label: [] for label in runners}
    workers = ["-n", str(options.workers)] if options.workers else []
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(options.reps):
            closing = set()
            for label, runner in runners.items():
                command = [sys.executable, "-m", "pytest", "-q", *workers, "-p", "no:cacheprovider"]
                command += ["--no-circle-cache", "--no-export-cache", f"--wrapq-report-dir={scratch}/{label[:5]}{rep}"]
                command.append(options.selection)
                began = time.monotonic()
                done = runner(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
                times[label].append(time.monotonic() - began)
                closing.add((done.returncode, done.stdout.splitlines()[-1].rsplit(" in ", 1)[0]))
            if len(closing) != 1:
                print(f"the two runs disagree: {sorted(closing)}")
                return 1
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, value in medians.items():
        print(f"{label:24s} median {value:6.2f} s over {options.reps}")
    print(f"ratio fresh / forked: {medians['fresh interpreter'] / medians['forked from the server']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
