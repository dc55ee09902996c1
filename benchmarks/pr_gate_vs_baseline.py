"""Side-by-side timing: today's PR gate vs the cold matrix of an earlier commit.

    ./scripts/env.sh python benchmarks/pr_gate_vs_baseline.py [--baseline COMMIT] [--target RATIO] [--reps 1]

Issue #19 asked that the cases, sweeps and algorithm cases it added keep the PR gate within
1.5x of the cold matrix as it was before them (the defaults); issue #36 that the reach it added keep
it within 1.3x of the gate before it (``--baseline 4b3a1c5 --target 1.3``). Each repetition runs,
in turn, in a fresh process with fresh, empty Circle and export caches and report directory:
  1. ``pytest -n auto`` in a detached worktree of ``--baseline`` (default: the commit before
     the first #19 change, the wrapper coverage recorder);
  2. the same command in this checkout (the PR gate: tiny profile, ``--sweep pr``).
Both use this checkout's virtual environment (the pinned stack did not change between them).
It prints items, outcomes, wall and worker time per run, the median wall ratio, each repetition's ratio and
the worker-time ratio. Each checkout is collected once, untimed, before the first repetition. The machine is shared
and noisy: only ratios measured side by side in one invocation mean anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The parent of 6709a80 ("Wrapper coverage measured at run time"), the first commit of #19.
BASELINE = "6709a80^"
TARGET_RATIO = 1.5


def warm_up(checkout: Path) -> None:
    """Collect once, untimed: byte-compiles the checkout and loads torch / transformers / tico from disk,
    so the first timed run of a fresh worktree does not pay what the other checkout already paid."""
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=checkout,
        capture_output=True,
        text=True,
    )


def cold_run(checkout: Path) -> tuple[float, dict[str, int], float]:
    """One cold ``pytest -n auto`` in ``checkout``: wall seconds, outcome counts and worker time (the
    sum of item durations: what the run costs in CPU, less sensitive to scheduling than the wall)."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch_dir = Path(scratch)
        start = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-n",
                "auto",
                "-p",
                "no:cacheprovider",
                "--wrapq-report-dir",
                str(scratch_dir / "reports"),
                "--circle-cache",
                str(scratch_dir / "circle"),
                "--export-cache",
                str(scratch_dir / "export"),
            ],
            cwd=checkout,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        results = scratch_dir / "reports" / "results.json"
        if done.returncode not in (0, 1) or not results.exists():
            raise RuntimeError(
                f"pytest in {checkout} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
            )
        counts: dict[str, int] = {}
        worker = 0.0
        for record in json.loads(results.read_text())["results"]:
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
            worker += float(record.get("duration") or 0.0)
    return wall, counts, worker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"commit to compare with (default {BASELINE})")
    parser.add_argument("--target", type=float, default=TARGET_RATIO, help="the wall ratio to meet")
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    walls: dict[str, list[float]] = {"baseline": [], "pr_gate": []}
    workers: dict[str, list[float]] = {"baseline": [], "pr_gate": []}
    with tempfile.TemporaryDirectory() as holder:
        worktree = Path(holder) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True, capture_output=True
        )
        try:
            for checkout in (worktree, ROOT):
                warm_up(checkout)
            for rep in range(args.reps):
                for label, checkout in (("baseline", worktree), ("pr_gate", ROOT)):
                    wall, counts, worker = cold_run(checkout)
                    walls[label].append(wall)
                    workers[label].append(worker)
                    print(
                        f"rep {rep + 1}: {label:8s} ({commit if label == 'baseline' else head}) "
                        f"{sum(counts.values())} items {counts}, cold {wall:.1f} s, worker time {worker:.1f} s",
                        flush=True,
                    )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True)
    base, gate = statistics.median(walls["baseline"]), statistics.median(walls["pr_gate"])
    ratio = gate / base
    per_rep = [g / b for g, b in zip(walls["pr_gate"], walls["baseline"])]
    worker_ratio = statistics.median(workers["pr_gate"]) / statistics.median(workers["baseline"])
    print(
        f"\nbaseline {commit} cold matrix: median {base:.1f} s; PR gate at {head}: median {gate:.1f} s; "
        f"ratio {ratio:.2f} (per repetition: {', '.join(f'{r:.2f}' for r in per_rep)}; worker-time ratio "
        f"{worker_ratio:.2f}) (target <= {args.target}: {'met' if ratio <= args.target else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
