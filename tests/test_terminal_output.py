"""A run's terminal output is read by people: the summary and findings fit 120 columns, expected
failures are one line per finding, and a green run stays small (the whole matrix's figure, under
40 KB, is .ci/run's gate)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]
SELECTION = "nn_linear or llama_attention_decode or gemma4_text_mlp"


def test_a_green_selection_prints_narrow_sections_and_one_line_per_expected_failure(tmp_path):
    done = preloaded_python.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-k", SELECTION, f"--wrapq-report-dir={tmp_path}"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "wrapq summary" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("results: "))
    wide = [line for line in lines[start:end] if len(line) > 120]
    assert wide == []
    # expected failures: one line per finding in the findings section, no paragraph per item
    assert any(line.startswith("open   rotate-half-two-qparams:") for line in lines[start:end])
    assert not any(line.startswith("XFAIL ") for line in lines)
    assert len(done.stdout.encode()) < 20000  # a handful of cases: a few KB (the whole matrix: under 40 KB)


BROKEN_CASE = """
import torch
from harness import Case


def build(profile):
    raise RuntimeError("the builder is broken: " + "x" * 10)


CASES = [Case(name="broken_builder", family="nn", build=build)]
"""


def test_a_failed_stage_prints_its_traceback_once_and_the_other_items_point_to_it(tmp_path):
    cases = tmp_path / "cases_here"
    cases.mkdir()
    (cases / "broken_case.py").write_text(BROKEN_CASE)
    done = preloaded_python.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            f"--wrapq-cases-dir={cases}",
            f"--wrapq-report-dir={tmp_path / 'r'}",
        ],
        cwd=REPO,
        # on CI pytest's short summary would repeat each failure's whole message, traceback included
        env={**os.environ, "CI": "true"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    failed = done.stdout.count("stage 'reference' failed: RuntimeError: the builder is broken")
    assert done.returncode == 1 and failed >= 5, done.stdout[-3000:]
    assert done.stdout.count('raise RuntimeError("the builder is broken: "') == 1
    assert done.stdout.count("(traceback shown once, at ") >= failed // 2
