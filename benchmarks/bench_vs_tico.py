"""Side-by-side timing: TICO's own wrapper smoke run vs this harness's full matrix.

    ./scripts/env.sh python benchmarks/bench_vs_tico.py [--reps 3] [--cases a,b,...] [--json out.json]

Over the TICO smoke cases this harness covers (same names), each repetition runs, in turn:
  1. TICO's smoke suite in a fresh process, one case after another with Circle export
     (``run_wrapper_smoke(..., export="circle")``), 1 torch thread -- what TICO does;
  2. ``pytest -n auto`` over the same cases with every check, cold: fresh, empty Circle and
     export caches and report directory (nothing reused from earlier runs);
  3. the same command again with the caches step 2 left (warm: a rerun with nothing changed).
  4. with ``--selected`` (the default), for each of three real tico changes (a file as tico's
     0.4.0.dev261018 build has it, put over the pinned tico: one wrapper family, one pass, one
     observer), the same cold run with ``--select-changed`` against the pinned tico: what a pull
     request with that change waits for.
It prints medians, the ratios harness/TICO, per-stage totals, the harness's own overhead
(collection, result transport, golden I/O, mutation guard, report rendering) as a share of the
cold run's worker time, and peak memory per worker. The machine is shared and noisy: only
ratios measured side by side in one invocation mean anything.
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
import sys, time, json, resource, torch
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
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH-JSON " + json.dumps({"cases": out, "peak_rss_mb": peak}))
"""


def case_files() -> dict[str, str]:
    """Harness case name -> its case module (path relative to the repo root)."""
    sys.path.insert(0, str(ROOT))
    from harness.model.case_loading import load_cases

    return {case.name: file for file, case in load_cases()}


def covered_tico_cases() -> list[str]:
    """Harness case names that are also TICO smoke case names."""
    from tico.quantization.recipes.debug.wrapper_smoke.registry import case_names

    tico = set(case_names())
    return [name for name in case_files() if name in tico]


def run_tico(cases: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", TICO_RUNNER, out, ",".join(cases)], capture_output=True, text=True, cwd=out
        )
        wall = time.perf_counter() - start
    line = next((out for out in done.stdout.splitlines() if out.startswith("BENCH-JSON ")), None)
    if line is None:
        raise RuntimeError(f"TICO smoke run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall, json.loads(line.removeprefix("BENCH-JSON "))


# Real tico changes, each one file of the 0.4.0.dev261018 build put over the pinned tico.
CHANGED_BUILD = "0.4.0.dev261018"
CHANGES = {
    "one wrapper family (gemma4 text MLP)": "quantization/wrapq/wrappers/gemma4/quant_text_mlp.py",
    "one pass (DecomposeAddmm)": "passes/decompose_addmm.py",
    "one observer (EMAObserver)": "quantization/wrapq/observers/ema.py",
}


def changed_tree(work: Path, relative: str) -> Path:
    """A copy of the pinned tico with ``relative`` as the changed build has it."""
    import shutil

    from harness.tico_facts import tico_identity, tico_sources

    tree = work / relative.replace("/", "_")
    shutil.copytree(tico_identity.package_dir(), tree / "tico", ignore=shutil.ignore_patterns("__pycache__"))
    build = tico_sources.resolve(CHANGED_BUILD, ROOT / ".wrapq-cache" / "tico-sources")
    shutil.copyfile(build / relative, tree / "tico" / relative)
    return tree


def run_selected(cases: list[str], cache_dir: Path, tree: Path) -> tuple[float, dict, float]:
    """The cold run on ``tree``'s tico, selecting what its change reaches from the committed map."""
    import os

    from harness.tico_facts import tico_identity

    pinned = str(tico_identity.package_dir())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]))
    return run_harness(cases, cache_dir, ("--select-changed", pinned), env)


def run_harness(
    cases: list[str], cache_dir: Path, extra: tuple[str, ...] = (), env: dict | None = None
) -> tuple[float, dict, float]:
    """One `pytest -n auto` over exactly these cases; returns wall, results.json, and the
    time the controller's report writing takes (re-rendered here from the same document)."""
    files = case_files()
    node_ids = [f"{files[name]}::{name}[tiny]" for name in cases]
    with tempfile.TemporaryDirectory() as reports:
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
                reports,
                "--circle-cache",
                str(cache_dir / "circle"),
                "--export-cache",
                str(cache_dir / "export"),
                *extra,
                *node_ids,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        doc = json.loads((Path(reports) / "results.json").read_text())
        render = report_render_seconds(doc, Path(reports))
    if done.returncode not in (0, 1):
        raise RuntimeError(f"harness run failed ({done.returncode}):\n{done.stdout[-2000:]}")
    return wall, doc, render


def report_render_seconds(doc: dict, out: Path) -> float:
    from harness.records.results import atomic_write_text
    from harness.report.html import write_report

    start = time.perf_counter()
    atomic_write_text(out / "again.json", json.dumps(doc, indent=2, sort_keys=True))
    write_report(doc, out / "again.html")
    return time.perf_counter() - start


def stage_totals(doc: dict) -> dict[str, float]:
    """Seconds per stage kind, each stage counted once per case. A stage's time includes the
    stages it triggered first (stages are lazy), so kinds overlap; the order shows the cost."""
    per_case: dict[tuple[str, str], dict[str, float]] = {}
    for rec in doc["results"]:
        key = (rec.get("case"), rec.get("profile"))
        for stage, secs in (rec.get("stage_timings") or {}).items():
            per_case.setdefault(key, {})[stage] = max(per_case.get(key, {}).get(stage, 0.0), float(secs))
    totals: dict[str, float] = {}
    for stages in per_case.values():
        for stage, secs in stages.items():
            kind = stage.split("[")[0]
            totals[kind] = totals.get(kind, 0.0) + secs
    return totals


def cache_statuses(doc: dict, which: str = "circle_cache") -> dict[str, int]:
    """How the Circle ('circle_cache') or export ('export_cache') lookups of a run went."""
    counts: dict[str, int] = {}
    for rec in doc["results"]:
        status = (rec.get("evidence") or {}).get(which)
        if rec.get("check") == "circle_replay" and status:
            counts[status.split(":")[0]] = counts.get(status.split(":")[0], 0) + 1
    return counts


def overhead_share(doc: dict, wall: float, render: float) -> tuple[dict[str, float], float, int]:
    processes = doc["run"].get("processes") or {}
    totals: dict[str, float] = {"report_render": render}
    for stats in processes.values():
        for kind, secs in (stats.get("overhead") or {}).items():
            totals[kind] = totals.get(kind, 0.0) + float(secs)
    workers = sum(1 for name in processes if name.startswith("gw")) or 1
    return totals, sum(totals.values()) / (wall * workers), workers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default="", help="comma-separated subset (default: every covered TICO case)")
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    parser.add_argument("--no-selected", dest="selected", action="store_false", help="leave out the selected runs")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c] or covered_tico_cases()
    print(f"{len(cases)} cases: {', '.join(cases)}", flush=True)
    walls: dict[str, list[float]] = {"tico": [], "cold": [], "warm": []}
    selected_items: dict[str, str] = {}
    cold_doc = warm_doc = tico_detail = None
    cold_render = 0.0
    for rep in range(args.reps):
        wall, tico_detail = run_tico(cases)
        walls["tico"].append(wall)
        with tempfile.TemporaryDirectory() as cache:
            cold, cold_doc, cold_render = run_harness(cases, Path(cache))
            warm, warm_doc, _ = run_harness(cases, Path(cache))
        walls["cold"].append(cold)
        walls["warm"].append(warm)
        print(f"rep {rep + 1}: TICO {wall:.1f} s, harness cold {cold:.1f} s, warm {warm:.1f} s", flush=True)
        for label, relative in CHANGES.items() if args.selected else ():
            with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as work:
                seconds, doc, _ = run_selected(cases, Path(cache), changed_tree(Path(work), relative))
            walls.setdefault(label, []).append(seconds)
            selection = doc["run"].get("selection") or {}
            selected_items[label] = f"{selection.get('selected_items')} of {selection.get('collected_items')} items"
            print(f"rep {rep + 1}: PR gate, selected, {label}: {seconds:.1f} s ({selected_items[label]})", flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    failed = [name for name, r in tico_detail["cases"].items() if not r["passed"]]
    print(
        f"\nTICO smoke (sequential, Circle export): median {med['tico']:.1f} s, peak RSS "
        f"{tico_detail['peak_rss_mb']:.0f} MB" + (f"; TICO-reported failures: {', '.join(failed)}" if failed else "")
    )
    print(
        f"harness pytest -n auto, every check, cold:  median {med['cold']:.1f} s  ratio {med['cold'] / med['tico']:.2f}"
        f"  (target <= 0.70)  circle cache {cache_statuses(cold_doc)}, export cache "
        f"{cache_statuses(cold_doc, 'export_cache')}"
    )
    print(
        f"harness pytest -n auto, every check, warm:  median {med['warm']:.1f} s  ratio {med['warm'] / med['tico']:.2f}"
        f"  (target <= 0.20)  circle cache {cache_statuses(warm_doc)}, export cache "
        f"{cache_statuses(warm_doc, 'export_cache')}"
    )
    for label in selected_items:
        print(
            f"PR gate, selected, {label}, cold: median {med[label]:.1f} s  ratio {med[label] / med['tico']:.2f}"
            f"  (target <= 0.35)  {selected_items[label]}"
        )
    print("\nharness stage totals, cold run (s, summed over cases; lazy stages include what they triggered):")
    for kind, secs in sorted(stage_totals(cold_doc).items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {kind:28s} {secs:8.1f}")
    totals, share, workers = overhead_share(cold_doc, walls["cold"][-1], cold_render)
    print(
        f"\nharness overhead, cold run: {sum(totals.values()):.2f} s of {workers} workers x {walls['cold'][-1]:.1f} s "
        f"= {100 * share:.1f}% (target <= 5%)"
    )
    for kind, secs in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:20s} {secs:7.2f} s")
    print("\npeak memory per process, cold run:")
    for name, stats in sorted((cold_doc["run"].get("processes") or {}).items()):
        after = list((stats.get("rss_after_group_mb") or {}).values())
        extra = (
            f"; RSS after each case group: first {after[0]:.0f}, last {after[-1]:.0f}, max {max(after):.0f} MB"
            if after
            else ""
        )
        print(f"  {name:10s} peak {stats.get('peak_rss_mb', 0):7.0f} MB{extra}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cases": cases,
                    "walls": walls,
                    "medians": med,
                    "ratios": {key: value / med["tico"] for key, value in med.items() if key != "tico"},
                    "selected_items": selected_items,
                    "overhead": totals,
                    "overhead_share": share,
                    "processes": cold_doc["run"].get("processes"),
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
