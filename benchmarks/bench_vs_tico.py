"""Side-by-side timing: TICO's own wrapper smoke run vs this harness's full matrix.

    ./scripts/env.sh python benchmarks/bench_vs_tico.py [--reps 3] [--cases a,b,...]

For the TICO cases this harness covers (same names), each repetition runs, alternating:
  1. TICO's smoke suite in a fresh process, one case after another with Circle export
     (``run_wrapper_smoke(..., export="circle")``), 1 torch thread;
  2. ``pytest -n auto`` over the same cases with every check, cold (fresh report dir).
It prints the medians, the ratio harness/TICO, per-stage totals from the harness's
results.json, and the harness's own overhead (wall time not spent in stages or checks).
The machine is shared and noisy: only ratios measured side by side in one run are meaningful.
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

TICO_RUNNER = r"""
import sys, time, json, torch
torch.set_num_threads(1)
from tico.quantization.recipes.debug.wrapper_smoke.runner import run_wrapper_smoke
out = {}
for name in sys.argv[2].split(","):
    start = time.perf_counter()
    try:
        result = run_wrapper_smoke(name, export="circle", output_dir=sys.argv[1], emit_plot=False)
        ok = bool(result.passed)
    except Exception as exc:
        ok = False
    out[name] = {"seconds": time.perf_counter() - start, "passed": ok}
print("BENCH-JSON " + json.dumps(out))
"""


def case_files() -> dict[str, str]:
    """Harness case name -> its case module file."""
    sys.path.insert(0, str(ROOT))
    from harness.catalog import load_cases

    return {case.name: file for file, case in load_cases()}


def covered_tico_cases() -> list[str]:
    """Harness case names that are also TICO smoke case names."""
    from tico.quantization.recipes.debug.wrapper_smoke.registry import case_names

    tico = set(case_names())
    return [name for name in case_files() if name in tico]


def run_tico(cases: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", TICO_RUNNER, out, ",".join(cases)],
                              capture_output=True, text=True, cwd=out)
        wall = time.perf_counter() - start
    line = next((l for l in done.stdout.splitlines() if l.startswith("BENCH-JSON ")), None)
    if line is None:
        raise RuntimeError(f"TICO smoke run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall, json.loads(line.removeprefix("BENCH-JSON "))


def run_harness(cases: list[str]) -> tuple[float, dict]:
    files = case_files()
    node_ids = [f"cases/{files[name]}::{name}[tiny]" for name in cases]  # exactly these cases
    with tempfile.TemporaryDirectory() as reports:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
                               "--wrapq-report-dir", reports, *node_ids],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        doc = json.loads((Path(reports) / "results.json").read_text())
    if done.returncode not in (0, 1):
        raise RuntimeError(f"harness run failed ({done.returncode}):\n{done.stdout[-2000:]}")
    return wall, doc


def stage_totals(doc: dict) -> tuple[dict[str, float], float]:
    """Seconds per stage kind (each stage counted once per case) and the summed run time of
    all checks -- which includes the stages they triggered, since stages run lazily inside
    the first check that needs them."""
    per_case: dict[tuple[str, str], dict[str, float]] = {}
    checks = 0.0
    for rec in doc["results"]:
        key = (rec.get("case"), rec.get("profile"))
        for stage, secs in (rec.get("stage_timings") or {}).items():
            per_case.setdefault(key, {})[stage] = max(per_case.get(key, {}).get(stage, 0.0), float(secs))
        checks += float(rec.get("check_seconds") or 0.0)
    totals: dict[str, float] = {}
    for stages in per_case.values():
        for stage, secs in stages.items():
            kind = stage.split("[")[0]
            totals[kind] = totals.get(kind, 0.0) + secs
    return totals, checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default="", help="comma-separated subset (default: every covered TICO case)")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c] or covered_tico_cases()
    print(f"{len(cases)} cases: {', '.join(cases)}")
    tico_walls, harness_walls, last_doc, tico_detail = [], [], None, {}
    for rep in range(args.reps):
        wall, tico_detail = run_tico(cases)
        tico_walls.append(wall)
        wall_h, last_doc = run_harness(cases)
        harness_walls.append(wall_h)
        print(f"rep {rep + 1}: TICO {wall:.1f} s, harness {wall_h:.1f} s")
    tico_med, harness_med = statistics.median(tico_walls), statistics.median(harness_walls)
    failed = [name for name, r in tico_detail.items() if not r["passed"]]
    print(f"\nTICO smoke (sequential, Circle export): median {tico_med:.1f} s"
          + (f"; TICO-reported failures: {', '.join(failed)}" if failed else ""))
    print(f"harness pytest -n auto (all checks, cold): median {harness_med:.1f} s")
    print(f"ratio harness/TICO: {harness_med / tico_med:.2f}")
    totals, checks = stage_totals(last_doc)
    print("\nharness stage totals (s, summed over cases; workers run in parallel):")
    for kind, secs in sorted(totals.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {kind:28s} {secs:8.1f}")
    workers = 2
    capacity = harness_walls[-1] * workers
    print(f"time inside checks (stages included): {checks:.1f} s of {capacity:.1f} s worker capacity "
          f"({workers} workers x {harness_walls[-1]:.1f} s wall)")
    print(f"outside checks (start-up, imports, collection, transport, report, idle): "
          f"{100 * (1 - checks / capacity):.0f}% of capacity")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
