"""Measure the platform noise and the seeded-defect signal in every golden tensor, side by side.

    ./scripts/env.sh python scripts/golden_noise.py [--out reports/noise] [--cases a,b] [--jobs 2]

Noise: every case's golden tensors are recomputed under several kernel selections (ATEN CPU
capability default / avx2 / native, MKL and oneDNN held to SSE4, 1 and 2 torch threads), each
in its own process, and compared with the committed goldens. Signal: the seeded wrapper
defects of harness/golden/defects.py are applied under the native and the scalar selection and
compared the same way. The comparator's statistics (harness/golden/portable.py) are printed per case:
the largest value any clean kernel selection reached and the smallest any defect reached, per
tensor kind, with the margin between them. ``--markdown`` writes the README table.

Each (selection, defect) run writes ``<out>/<run>/<case>.safetensors``; reruns reuse them
unless ``--fresh``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> environment. "native" is what the machine picks; the others force older kernels.
SELECTIONS: dict[str, dict[str, str]] = {
    "native-1t": {"WRAPQ_THREADS": "1"},
    "native-2t": {"WRAPQ_THREADS": "2"},
    "avx2-1t": {"ATEN_CPU_CAPABILITY": "avx2", "WRAPQ_THREADS": "1"},
    "default-1t": {"ATEN_CPU_CAPABILITY": "default", "WRAPQ_THREADS": "1"},
    "default-2t": {"ATEN_CPU_CAPABILITY": "default", "WRAPQ_THREADS": "2"},
    "sse4-1t": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "WRAPQ_THREADS": "1",
    },
}
# Defects are measured under the fastest and the slowest kernel selection.
DEFECT_SELECTIONS = ("native-1t", "default-1t")


def golden_cases(only: set[str]) -> list:
    from harness.model.case_loading import load_cases

    return [case for _, case in load_cases() if "tiny" in case.golden_profiles and (not only or case.name in only)]


def collect_run(out: Path, defect: str | None, only: set[str]) -> int:
    """Worker: recompute every case's golden tensors in this process's kernel selection."""
    import torch
    from safetensors.torch import save_file

    from harness.golden import defects
    from harness.golden import tensors as golden
    from harness.pipeline import Pipeline

    torch.set_num_threads(int(os.environ.get("WRAPQ_THREADS", "1")))
    out.mkdir(parents=True, exist_ok=True)
    for case in golden_cases(only):
        target = out / f"{case.name}.safetensors"
        if target.exists():
            continue
        pipeline = Pipeline(case, "tiny")
        meta = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": str(torch.get_num_threads())}
        try:
            if defect:
                applied = defects.apply(defect, pipeline)
                if applied is None:
                    (out / f"{case.name}.na").write_text("defect does not apply")
                    continue
                meta["defect"] = applied
            tensors, steps = golden.collect(pipeline)
        except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
            (out / f"{case.name}.error").write_text(f"{type(exc).__name__}: {exc}")
            continue
        meta["steps"] = json.dumps(steps)
        meta["input_hash"] = golden.input_hash(pipeline)
        meta["sketch"] = json.dumps(golden.input_sketch(pipeline))
        save_file(tensors, str(target), metadata=meta)
    return 0


def run_all(out: Path, only: set[str], jobs: int, fresh: bool) -> None:
    runs = [(sel, None) for sel in SELECTIONS]
    from harness.golden.defects import DEFECTS

    runs += [(sel, d) for d in DEFECTS for sel in DEFECT_SELECTIONS]

    def one(run: tuple[str, str | None]) -> str:
        sel, defect = run
        name = f"{sel}+{defect}" if defect else sel
        target = out / name
        if fresh and target.exists():
            for f in target.iterdir():
                f.unlink()
        env = {**os.environ, **SELECTIONS[sel], "OMP_NUM_THREADS": SELECTIONS[sel]["WRAPQ_THREADS"]}
        cmd = [sys.executable, __file__, "--collect", str(target)] + (["--defect", defect] if defect else [])
        if only:
            cmd += ["--cases", ",".join(sorted(only))]
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-400:]}"
        return f"{name}: {status} ({time.perf_counter() - start:.0f} s)"

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(one, runs):
            print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "noise"))
    parser.add_argument("--cases", default="", help="comma-separated subset (default: every case with a golden)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (each uses its own threads)")
    parser.add_argument("--fresh", action="store_true", help="recompute runs already on disk")
    parser.add_argument("--markdown", default="", help="write the per-case table to this file as well")
    parser.add_argument(
        "--write-noise",
        action="store_true",
        help="write the measured noise to golden/noise.json (the per-tensor limits; review the diff)",
    )
    parser.add_argument("--collect", default="", help=argparse.SUPPRESS)
    parser.add_argument("--defect", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from harness.model.case_loading import add_configured_import_roots

    add_configured_import_roots()
    only = {c for c in args.cases.split(",") if c}
    if args.collect:
        return collect_run(Path(args.collect), args.defect or None, only)
    out = Path(args.out)
    run_all(out, only, args.jobs, args.fresh)
    from harness.golden.defects import DEFECTS
    from harness.golden.noise_report import Runs, measured_noise, report

    golden_dir = ROOT / "golden"
    clean = list(SELECTIONS)
    runs = Runs(out, golden_dir, only)
    noise = measured_noise(runs, clean)
    if args.write_noise:
        if only:
            parser.error("--write-noise needs every case (drop --cases)")
        (golden_dir / "noise.json").write_text(json.dumps(noise, indent=1, sort_keys=True) + "\n")
        print(f"wrote {golden_dir / 'noise.json'}")
    text = report(runs, clean, {d: [f"{s}+{d}" for s in DEFECT_SELECTIONS] for d in DEFECTS}, noise)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
