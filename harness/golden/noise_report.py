"""Platform noise vs seeded-defect signal per case, from the runs scripts/golden_noise.py made.

Every run (a kernel selection, clean or with one seeded defect) is compared with the committed
goldens by the portable comparator. The clean runs give the noise: the largest value of each
statistic per tensor, which ``measured_noise`` turns into golden/noise.json (the per-tensor
err_ratio limits come from it). The defect runs are then scored against those limits: a
score above 1 is caught, and the table says for each case how far the noisiest clean run
stays below its limits and how far the weakest caught defect lies above them.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.golden import portable
from harness.golden import tensors as golden
from harness.golden.portable import GoldenTolerance

GATED = ("float_rel", "scale_rel", "zero_point_abs", "err_ratio")


def load_run(directory: Path) -> dict[str, tuple[dict, dict, dict]]:
    """case -> (tensors, steps, metadata) of one run directory."""
    from safetensors import safe_open

    runs = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        runs[path.stem] = (tensors, json.loads(meta.get("steps", "{}")), meta)
    return runs


class Runs:
    """The runs under ``out`` and the committed goldens, each read from disk once, and each
    clean run's statistics against the goldens computed once (the held-out scoring reuses them)."""

    def __init__(self, out: Path, golden_dir: Path, only: set[str]):
        self.out, self.golden_dir, self.only = out, golden_dir, only
        self._runs: dict[str, dict] = {}
        self._goldens: dict[str, tuple[dict, dict, dict]] = {}
        self._stats: dict[str, dict] = {}

    def run(self, name: str) -> dict[str, tuple[dict, dict, dict]]:
        if name not in self._runs:
            self._runs[name] = {c: v for c, v in load_run(self.out / name).items() if not self.only or c in self.only}
        return self._runs[name]

    def golden(self, case: str) -> tuple[dict, dict, dict]:
        """(manifest, stored tensors, steps) of the committed golden."""
        if case not in self._goldens:
            manifest, stored = golden.load(self.golden_dir, case, "tiny", case)
            self._goldens[case] = (manifest, stored, {k: v.get("step") for k, v in manifest["tensors"].items()})
        return self._goldens[case]

    def compare(self, run: str, case: str, measured: dict | None = None) -> dict[str, dict[str, Any]]:
        manifest, stored, steps = self.golden(case)
        return portable.compare(stored, self.run(run)[case][0], steps, GoldenTolerance(), measured)

    def stats(self, run: str) -> dict[str, dict[str, dict[str, Any]]]:
        """case -> tensor -> statistics of one run against the goldens (limits not involved)."""
        if run not in self._stats:
            self._stats[run] = {case: self.compare(run, case) for case in self.run(run)}
        return self._stats[run]


def measured_noise(runs: Runs, clean_runs: list[str]) -> dict[str, Any]:
    """Per case and tensor, the largest value of every gated statistic over the clean runs."""
    cases: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    hashes: dict[str, set[str]] = defaultdict(set)
    sketch_moves: dict[str, float] = defaultdict(float)
    for run in clean_runs:
        for case, (_, _, meta) in runs.run(run).items():
            manifest = runs.golden(case)[0]
            hashes[case].add(meta.get("input_hash", ""))
            if "sketch" in meta:
                moves = golden.sketch_moves(manifest.get("input_sketch") or {}, json.loads(meta["sketch"]))
                sketch_moves[case] = max([sketch_moves[case], *moves.values()])
            for key, r in runs.stats(run)[case].items():
                for stat in GATED:
                    if stat in r:
                        cases[case][key][stat] = max(cases[case][key].get(stat, 0.0), r[stat])
    return {
        "written_by": "scripts/golden_noise.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "platform": golden.platform_record(),
        "runs": clean_runs,
        "input_hash_stable": {c: h == {runs.golden(c)[0]["input_hash"]} for c, h in hashes.items()},
        "input_sketch_max_move": dict(sketch_moves),
        "cases": {
            c: {
                k: {s: v for s, v in stats.items() if s == "err_ratio"}
                for k, stats in t.items()
                if "err_ratio" in stats
            }
            for c, t in cases.items()
        },
        "maxima": {
            c: {s: max((stats.get(s, 0.0) for stats in t.values()), default=0.0) for s in GATED}
            for c, t in cases.items()
        },
    }


def _case_scores(runs: Runs, run: str, noise: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """case -> (worst score over tensors, 'tensor:statistic') for one run, against the measured limits."""
    scores = {}
    for case in runs.run(run):
        results = runs.compare(run, case, noise["cases"].get(case, {}))
        key, r = max(results.items(), key=lambda kv: kv[1]["score"])
        scores[case] = (r["score"], f"{key}:{r['by']}")
    return scores


def report(runs: Runs, clean_runs: list[str], defect_runs: dict[str, list[str]], noise: dict[str, Any]) -> str:
    """Markdown: per case, noise score (must stay < 1) and, per defect, its weakest score (> 1 caught)."""
    clean = {run: _case_scores(runs, run, noise) for run in clean_runs}
    # Out of sample: each clean selection scored against limits measured without it.
    held_out = {
        run: _case_scores(runs, run, measured_noise(runs, [r for r in clean_runs if r != run])) for run in clean_runs
    }
    defects = {d: {run: _case_scores(runs, run, noise) for run in names} for d, names in defect_runs.items()}
    cases = sorted({c for scores in clean.values() for c in scores})
    header = ["case", "worst clean score", "held out", "float_rel", "scale_rel", "err_ratio"] + [
        f"{d}" for d in defect_runs
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    caught = {d: 0 for d in defect_runs}
    applied = {d: 0 for d in defect_runs}
    worst_noise = worst_held = 0.0
    for case in cases:
        noise_score = max(clean[run][case][0] for run in clean if case in clean[run])
        worst_noise = max(worst_noise, noise_score)
        maxima = noise["maxima"].get(case, {})
        held = max(held_out[run][case][0] for run in held_out if case in held_out[run])
        worst_held = max(worst_held, held)
        row = [
            f"`{case}`",
            f"{noise_score:.2g}",
            f"{held:.2g}",
            f"{maxima.get('float_rel', 0):.1e}",
            f"{maxima.get('scale_rel', 0):.1e}",
            f"{maxima.get('err_ratio', 0):.2g}",
        ]
        for d, runs in defects.items():
            hits = [runs[run][case][0] for run in runs if case in runs[run]]
            if not hits:
                row.append("n/a")
                continue
            applied[d] += 1
            weakest = min(hits)
            caught[d] += weakest > 1
            row.append(("" if weakest > 1 else "**missed** ") + (f"{weakest:.3g}" if math.isfinite(weakest) else "inf"))
        lines.append("| " + " | ".join(row) + " |")
    summary = [
        f"Worst clean score over {len(cases)} cases and {len(clean_runs)} kernel selections: "
        f"{worst_noise:.2g} (margin {1 / worst_noise if worst_noise else math.inf:.3g}x below the limit); "
        f"held out (each selection against limits measured without it): {worst_held:.2g}."
    ]
    for d in defect_runs:
        summary.append(f"- {d}: caught in {caught[d]} of {applied[d]} cases where it applies, under every selection.")
    unstable = [c for c, ok in noise["input_hash_stable"].items() if not ok]
    summary.append(
        f"Input hash identical across selections and to the manifest: "
        f"{'yes' if not unstable else 'no: ' + ', '.join(unstable)}; largest float-input sketch move "
        f"{max(noise['input_sketch_max_move'].values(), default=0.0):.2g} (stale above {golden.SKETCH_REL:g})."
    )
    return "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
