"""Per exported case, side by side: the export-reuse fingerprint vs one strict torch.export,
and tico's conversion as tico runs it vs with deferred FX code generation.

    ./scripts/env.sh python benchmarks/export_costs.py [--cases a,b,...]

All run in this process on the same QUANT export adapter and inputs (1 torch thread). The
fingerprint is what a warm rerun pays instead of the trace (harness/export/export_reuse.py); the
deferred conversion is what every cold conversion pays (harness/export/stages.py), and its Circle
bytes and audited graph are compared with tico's own conversion for every case. Last, the
time of one conversion-code fingerprint, which every Circle cache lookup and store pays."""

from __future__ import annotations

import argparse
import time
from typing import Any


def timed_conversion(program: Any, defer_codegen: bool) -> tuple[Any, float, int]:
    """(bytes and audit, seconds, whole-graph code generations) of one conversion."""
    from harness.export.circle_conversion import convert_with_audit, counting_codegens

    with counting_codegens() as codegens:
        start = time.perf_counter()
        result = convert_with_audit(program, defer_codegen=defer_codegen)
        return result, time.perf_counter() - start, codegens[0]


def conversion_fingerprint_seconds(repeats: int = 20) -> float:
    """Median time of one conversion-code fingerprint (harness.export.circle_cache), as paid per lookup."""
    import statistics

    from harness.export.circle_cache import conversion_code_fingerprint

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        conversion_code_fingerprint()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated subset (default: every case with export)")
    args = parser.parse_args()
    from harness.model.case_loading import add_configured_import_roots, load_cases

    add_configured_import_roots()
    import torch

    torch.set_num_threads(1)
    from harness.export.entry_store import Uncacheable
    from harness.export.execution_key import execution_key
    from harness.export.stages import export_program
    from harness.pipeline import Pipeline, StageError, warm_imports

    warm_imports()
    chosen = {c for c in args.cases.split(",") if c}
    totals = {"fingerprint": 0.0, "export": 0.0, "as_tico": 0.0, "deferred": 0.0}
    differing = []
    print(
        f"{'case':45s} {'fingerprint s':>13s} {'strict export s':>15s} "
        f"{'convert as tico s':>17s} {'deferred codegen s':>18s} {'codegens as tico/deferred':>25s}  same result"
    )
    for _, case in load_cases():
        if case.export is None or (chosen and case.name not in chosen):
            continue
        pipeline = Pipeline(case, "tiny")
        name = pipeline.export_sample_name
        try:
            adapter = pipeline.export_adapter("quant", name)
        except StageError as err:
            print(f"{case.name:45s} skipped: {err}")
            continue
        inputs = case.export.args(pipeline.sample(name))
        start = time.perf_counter()
        try:
            execution_key(adapter, inputs)
        except Uncacheable as why:
            print(f"{case.name:45s} uncacheable: {why}")
            continue
        fingerprint = time.perf_counter() - start
        start = time.perf_counter()
        program = export_program(adapter, inputs)
        export = time.perf_counter() - start
        as_tico, as_tico_s, as_tico_codegens = timed_conversion(program, defer_codegen=False)
        deferred, deferred_s, deferred_codegens = timed_conversion(program, defer_codegen=True)
        same = deferred == as_tico
        if not same:
            differing.append(case.name)
        for key, secs in (
            ("fingerprint", fingerprint),
            ("export", export),
            ("as_tico", as_tico_s),
            ("deferred", deferred_s),
        ):
            totals[key] += secs
        codegens = f"{as_tico_codegens}/{deferred_codegens}"
        print(
            f"{case.name:45s} {fingerprint:13.3f} {export:15.2f} {as_tico_s:17.2f} {deferred_s:18.2f} "
            f"{codegens:>25s}  {'yes' if same else 'NO'}",
            flush=True,
        )
    print(
        f"{'total':45s} {totals['fingerprint']:13.2f} {totals['export']:15.1f} "
        f"{totals['as_tico']:17.1f} {totals['deferred']:18.1f}"
    )
    if totals["as_tico"]:
        print(f"deferred / as tico: {totals['deferred'] / totals['as_tico']:.2f}")
    print(
        f"conversion-code fingerprint (Circle cache key, each lookup and store): "
        f"{conversion_fingerprint_seconds() * 1000:.1f} ms median of 20"
    )
    if differing:
        print(f"deferred conversion differs from tico's own on: {', '.join(differing)}")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
