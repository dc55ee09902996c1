"""Harness test modules with the in-process stage sharing (tests/stage_sharing.py) on and off, side by side
in one process, alternating.

    ./scripts/env.sh python benchmarks/stage_sharing.py [--reps 1] [--workers 2] [MODULE ...]

Each rep runs the modules (default: the in-process export and contract defect tests) once with sharing
(the tests' default) and once with ``WRAPQ_TESTS_FRESH_STAGES=1``, and checks both give the same closing
line. Prints each side's wall and CPU seconds (the run and its children), their medians and the ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODULES = (
    "tests/test_export_check_defects.py",
    "tests/test_contract_check_defects.py",
    "tests/test_replay_diagnoses.py",
    "tests/test_present_v_per_head.py",
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="xdist workers of each run (0: none)")
    parser.add_argument("modules", nargs="*", default=list(DEFAULT_MODULES))
    options = parser.parse_args()
    sides = {"shared": {}, "fresh": {"WRAPQ_TESTS_FRESH_STAGES": "1"}}
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for rep in range(options.reps):
        closing = set()
        for side, extra in sides.items():
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(options.workers)]
            command += options.modules
            began, cpu_before = time.monotonic(), _children_cpu()
            done = subprocess.run(command, cwd=REPO, env=os.environ | extra, capture_output=True, text=True)
            wall[side].append(time.monotonic() - began)
            cpu[side].append(_children_cpu() - cpu_before)
            last = done.stdout.splitlines()[-1] if done.stdout else done.stderr[-300:]
            closing.add((done.returncode, last.rsplit(" in ", 1)[0]))
            print(f"rep {rep} {side:6s} wall {wall[side][-1]:6.1f} s cpu {cpu[side][-1]:6.1f} s  {last}", flush=True)
        if len(closing) != 1:
            print(f"the two runs disagree: {sorted(closing)}")
            return 1
    median = {side: (statistics.median(wall[side]), statistics.median(cpu[side])) for side in sides}
    for side, (w, c) in median.items():
        print(f"{side:6s} median wall {w:6.1f} s, cpu {c:6.1f} s over {options.reps}")
    print(
        f"ratio fresh / shared: wall {median['fresh'][0] / median['shared'][0]:.2f}, "
        f"cpu {median['fresh'][1] / median['shared'][1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
