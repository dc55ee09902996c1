"""A run's terminal output is read by people: the summary and findings fit 120 columns, expected
failures are one line per finding, and a green run stays small (the whole matrix's figure, under
40 KB, is .ci/run's gate)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SELECTION = "nn_linear or llama_attention_decode or gemma4_text_mlp"


def test_a_green_selection_prints_narrow_sections_and_one_line_per_expected_failure(tmp_path):
    done = subprocess.run(
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
