"""A synthetic nightly history at scale for the dashboard's tests: ``cases`` cases in five
families x ``profiles`` x ``nights`` runs on one testbed, 12 tracked series per (case, profile),
with three injected changes the dashboard must tell apart:

- a **regression** after a commit: ``REGRESSION`` (PEIR x1.6 in the last run, new commit);
- an **acknowledged** change in the same run: ``ACKNOWLEDGED`` (SQNR -6 dB), covered by
  ``ack_toml()``;
- a **dependency bump**: ``BUMP`` (Circle max steps 1 -> 3 two runs before the last, when tico
  moved 0.3.0 -> 0.3.1 on the same commit).

``noisy=True`` gives every value a small night-to-night jitter (the worst case for page weight:
nothing repeats); ``noisy=False`` repeats values bit for bit, as runs on one testbed do.
"""

from __future__ import annotations

import random
from pathlib import Path

from harness.checks import all_checks, describe_checks
from harness.report import history_store as history

FAMILIES = ("llama", "qwen3_vl", "gemma4", "nn", "cnn")
PROFILES = ("tiny", "e2b_dims", "static_runtime")
PLATFORM = {
    "cpu": "Synthetic Xeon",
    "machine": "x86_64",
    "cpu_capability": "AVX512",
    "blas": "MKL",
    "torch_threads": 1,
    "env": {},
}
C_OLD, C_NEW = "1111111aaaaaaa", "2222222bbbbbbb"
METRICS = {  # check -> {metric: (typical value, relative jitter)}
    "quant_accuracy": {
        "peir": (0.05, 0.004),
        "mean_abs_diff": (0.01, 0.004),
        "max_abs_diff": (0.1, 0.004),
        "sqnr_db": (30.0, 0.002),
        "cosine": (0.999, 0.0001),
    },
    "circle_replay": {
        "fake_quantize_max_steps": (1.0, 0.0),
        "fake_quantize_mean_steps": (0.2, 0.01),
        "fake_quantize_max_abs_diff": (0.02, 0.01),
    },
    "golden": {"drifted": (0.0, 0.0), "worst_score": (0.3, 0.01)},
    "qparam_audit": {"missing_qparam": (2.0, 0.0)},
    "torch_export": {"max_abs_diff": (1e-6, 0.02)},
}
REGRESSION = ("llama_case_00", "tiny", "quant_accuracy", "peir")
ACKNOWLEDGED = ("qwen3_vl_case_01", "tiny", "quant_accuracy", "sqnr_db")
BUMP = ("gemma4_case_02", "tiny", "circle_replay", "fake_quantize_max_steps")


def case_names(cases: int) -> list[str]:
    return [f"{FAMILIES[i % len(FAMILIES)]}_case_{i:02d}" for i in range(cases)]


def ack_toml() -> str:
    case, profile, check, metric = ACKNOWLEDGED
    return (
        f'[[acknowledged]]\ncase = "{case}"\nprofile = "{profile}"\ncheck = "{check}"\nmetric = "{metric}"\n'
        f'commit = "{C_NEW[:8]}"\nreason = "int16 mask observer: SQNR moves by design"\n'
    )


def build(
    db: Path,
    cases: int = 50,
    profiles: tuple[str, ...] = PROFILES,
    nights: int = 100,
    noisy: bool = True,
    seed: int = 0,
) -> Path:
    rng = random.Random(seed)
    checks = describe_checks(all_checks())
    names = case_names(cases)
    for night in range(nights):
        last, bump = night == nights - 1, night >= nights - 3
        results = []
        for c, case in enumerate(names):
            for profile in profiles:
                for check, metrics in METRICS.items():
                    values = {}
                    for metric, (typical, jitter) in metrics.items():
                        value = typical * (1 + rng.gauss(0, jitter)) if noisy else typical
                        key = (case, profile, check, metric)
                        if last and key == REGRESSION:
                            value *= 1.6
                        if last and key == ACKNOWLEDGED:
                            value -= 6.0
                        if bump and key == BUMP:
                            value = 3.0
                        values[metric] = value
                    results.append(
                        {
                            "nodeid": f"cases/{FAMILIES[c % len(FAMILIES)]}.py::{case}::{check}[{profile}]",
                            "case": case,
                            "profile": profile,
                            "check": check,
                            "family": FAMILIES[c % len(FAMILIES)],
                            "outcome": "passed",
                            "metrics": values,
                        }
                    )
        doc = {
            "schema": 1,
            "results": results,
            "run": {
                "started_at": f"2026-{1 + night // 28:02d}-{1 + night % 28:02d}T02:00:00Z",
                "commit": C_NEW if last else C_OLD,
                "profiles": list(profiles),
                "exitstatus": 0,
                "versions": {"torch": "2.13.0", "tico": "0.3.1" if bump else "0.3.0"},
                "checks": checks,
                "platform": PLATFORM,
            },
        }
        history.append_run(db, doc)
    return db
