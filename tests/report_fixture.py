"""A small synthetic results.json document for report, merge and history tests, with hostile
strings in the places people type: case names, messages, stack traces."""

from __future__ import annotations

import copy

from harness.checks import all_checks, describe_checks

HOSTILE = "<script>alert('x')</script>"


def record(case: str, check: str, outcome: str = "passed", profile: str = "tiny", **extra) -> dict:
    rec = {
        "nodeid": f"cases/fixture.py::{case}::{check}[{profile}]",
        "case": case,
        "profile": profile,
        "check": check,
        "family": "fixture",
        "outcome": outcome,
        "message": "",
        "metrics": {},
        "duration": 0.5,
        "stage_timings": {"reference": 0.1, "wrap": 0.2},
    }
    rec.update(extra)
    return rec


def results_doc(commit: str = "abc123", peir: float = 0.05, started: str = "2026-11-30T00:00:00Z") -> dict:
    scatter = [[x / 10.0, x / 10.0 + 0.01 * ((-1) ** x)] for x in range(-20, 21)]
    hist = {"edges": [-0.02, -0.01, 0.0, 0.01, 0.02], "counts": [3, 10, 12, 4]}
    results = [
        record(
            "good_case",
            "quant_accuracy",
            metrics={"peir": peir, "mean_abs_diff": 0.01, "max_abs_diff": 0.1, "sqnr_db": 30.0, "cosine": 0.999},
            evidence={"default": {"scatter": scatter, "error_histogram": hist}},
            settings={"max_peir": 0.1, "max_mean_abs_diff": 0.1, "max_abs_diff": 1.0, "min_sqnr_db": 20.0},
        ),
        record(
            "good_case",
            "qparam_audit",
            metrics={"quantized_nodes": 90, "float_nodes": 1, "missing_qparam": 1, "missing_allowlisted": 0},
            evidence={
                "missing": [
                    {
                        "name": "permute_1",
                        "target": "aten.permute.default",
                        "users": 2,
                        "role": "node",
                        "stack_trace": 'File "wrapper.py", line 12, in forward\n    x = x.transpose(1, 2)',
                        "source": [],
                    }
                ]
            },
        ),
        record(
            "good_case",
            "circle_replay",
            metrics={"fake_quantize_max_steps": 1.0, "fake_quantize_mean_steps": 0.2},
            settings={"max_steps": 2.0, "mean_steps": 0.5},
        ),
        record("good_case", "golden", metrics={"tensors": 10, "drifted": 0}),
        record(
            "bad_case",
            "quant_accuracy",
            outcome="failed",
            message=f"PEIR exceeds threshold {HOSTILE}",
            metrics={"peir": 0.5},
        ),
        record(f"weird{HOSTILE}", "noquant_parity", outcome="skipped", message=f"not applicable: {HOSTILE}"),
    ]
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {
        "schema": 1,
        "run": {
            "started_at": started,
            "duration_s": 3.0,
            "exitstatus": 1,
            "commit": commit,
            "argv": [],
            "profiles": ["tiny"],
            "versions": {"torch": "2.13.0", "tico": "0.3.0"},
            "counts": counts,
            "golden_set": "g1",
            "shard": None,
            "checks": describe_checks(all_checks()),
        },
        "results": copy.deepcopy(results),
    }
