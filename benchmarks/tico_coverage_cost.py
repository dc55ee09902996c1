"""What ``--tico-coverage`` costs: the same selection of the matrix run with and without it, side by
side, alternating (the machine is shared and noisy), caches off so both runs do the same work.

    ./scripts/env.sh python benchmarks/tico_coverage_cost.py [--reps 2] [-k SELECTION] [-n 2]

Prints each run's wall time, the medians and their ratio (measured / plain).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(selection: str, workers: str, measured: bool, report: Path) -> float:
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", workers, "-p", "no:cacheprovider", "-k", selection]
    cmd += ["--no-circle-cache", "--no-export-cache", f"--wrapq-report-dir={report}"]
    if measured:
        cmd.append("--tico-coverage")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("-k", dest="selection", default="nn_ or llama_mlp or llama_attention_prefill")
    parser.add_argument("-n", dest="workers", default="2")
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for measured in (False, True) if rep % 2 == 0 else (True, False):
                seconds = run(args.selection, args.workers, measured, Path(tmp) / f"r{rep}{int(measured)}")
                times[measured].append(seconds)
                print(f"rep {rep} {'--tico-coverage' if measured else 'plain':>15}: {seconds:7.1f} s", flush=True)
    plain, measured = statistics.median(times[False]), statistics.median(times[True])
    print(f"median plain {plain:.1f} s, with --tico-coverage {measured:.1f} s: ratio {measured / plain:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
