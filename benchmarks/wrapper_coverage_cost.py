"""What the wrapper coverage measurement adds to a matrix run, per tiny case.

    ./scripts/env.sh python benchmarks/wrapper_coverage_cost.py [--reps 5]

For every tiny case: the QUANT evaluation forwards (every evaluation sample) timed with and
without the forward-hook recorder (median of --reps), and the one tree walk
(``harness.tico_facts.wrapper_coverage.measure``) the plugin does per case group. The matrix pays one
recorded evaluation and one walk per case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.model.case_loading import add_configured_import_roots, load_cases  # noqa: E402
from harness.pipeline import Pipeline, warm_imports  # noqa: E402
from harness.tico_facts import wrapper_coverage as wc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each xdist worker runs
    add_configured_import_roots()
    warm_imports()
    totals = {"plain": 0.0, "recorded": 0.0, "walk": 0.0}
    cases = 0
    for _, case in load_cases():
        if "tiny" not in case.profiles or case.unavailable_reason():
            continue
        pipeline = Pipeline(case, "tiny")
        model, samples = pipeline.quantized, list(pipeline.built.inputs.evaluation.values())

        def evaluate(record: bool) -> float:
            start = time.perf_counter()
            with torch.no_grad():
                for sample in samples:
                    if record:
                        with wc.record_forwards(set()):
                            sample.call(model)
                    else:
                        sample.call(model)
            return time.perf_counter() - start

        evaluate(False)  # warm-up
        plain = statistics.median(evaluate(False) for _ in range(args.reps))
        recorded = statistics.median(evaluate(True) for _ in range(args.reps))
        ran: set[int] = set()
        with torch.no_grad(), wc.record_forwards(ran):
            for sample in samples:
                sample.call(model)
        registered = wc.registered_wrappers()
        start = time.perf_counter()
        wc.measure(model, ran, registered, reference=pipeline.built.module)
        walk = time.perf_counter() - start
        totals["plain"] += plain
        totals["recorded"] += recorded
        totals["walk"] += walk
        cases += 1
        print(
            f"{case.name:45s} eval {plain * 1e3:8.1f} ms  recorded {recorded * 1e3:8.1f} ms  walk {walk * 1e3:6.2f} ms"
        )
    hook = totals["recorded"] - totals["plain"]
    print(
        f"\n{cases} cases: QUANT evaluation {totals['plain']:.3f} s plain, {totals['recorded']:.3f} s recorded "
        f"(hook cost {hook:+.3f} s), tree walks {totals['walk']:.3f} s; added per matrix run "
        f"{hook + totals['walk']:.3f} s of worker time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
