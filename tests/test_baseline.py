"""--baseline: a change is judged against its base run, not against the committed goldens alone.

The end-to-end tests run the matrix on ``nn_linear`` in a subprocess, with a golden directory whose
output tensor moved (as if the base tico already produced another value), so the base run fails
its golden. The head run on the same code must not be blamed for it; a head whose tensors differ
from the base's must still be red.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.golden import baseline
from harness.golden import tensors as golden
from tests import preloaded_python
from tests.helpers import edit_golden

REPO = Path(__file__).resolve().parents[1]
CASE = "nn_linear"


# -- the rules ----------------------------------------------------------------------------------


def test_signature_ignores_numbers_install_paths_and_line_numbers():
    a = "tensor add (/v/site-packages/tico/x/y.py:12, aten.add): scale 0.0131 zp 124"
    b = "tensor add (/src/TICO/tico/x/y.py:99, aten.add): scale 0.02 zp 3"
    assert baseline.signature(a) == baseline.signature(b)
    assert baseline.signature(a) != baseline.signature("tensor mul (tico/x/y.py, aten.mul): scale 1 zp 2")


def test_a_failure_is_pre_existing_only_when_the_base_failed_the_same_way_and_no_metric_got_worse():
    base = baseline.BaseRun(
        Path("/b/results.json"),
        "r1",
        {"version": "0.3.0"},
        {
            "n": {
                "outcome": "failed",
                "problems": ["[default] mean |diff| 0.2 exceeds threshold 0.08"],
                "metrics": {"mean_abs_diff": 0.2},
            },
            "passed": {"outcome": "passed", "problems": [], "metrics": {}},
        },
    )
    tracked = [("mean_abs_diff", "lower")]
    same = ["[default] mean |diff| 0.201 exceeds threshold 0.08"]
    assert baseline.pre_existing(base, "n", same, {"mean_abs_diff": 0.201}, tracked)
    # worse than the base by more than WORSE_REL: the change made it worse
    assert baseline.pre_existing(base, "n", same, {"mean_abs_diff": 0.3}, tracked) is None
    # a problem the base did not have
    assert baseline.pre_existing(base, "n", same + ["node x has no qparam"], {"mean_abs_diff": 0.2}, tracked) is None
    # the base passed, or never ran the item
    assert baseline.pre_existing(base, "passed", same, {}, tracked) is None
    assert baseline.pre_existing(base, "absent", same, {}, tracked) is None


def test_an_unreadable_baseline_is_a_clear_error(tmp_path):
    with pytest.raises(baseline.BaselineError, match="cannot read"):
        baseline.load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"items": []}))
    with pytest.raises(baseline.BaselineError, match="not a wrapq results.json"):
        baseline.load(tmp_path)


# -- end to end -----------------------------------------------------------------------------------


def _moved_golden_dir(tmp_path: Path) -> Path:
    """The committed goldens with nn_linear's quantized output moved well beyond its limit."""
    directory = tmp_path / "golden"
    directory.mkdir()
    for f in (REPO / "golden").iterdir():
        if f.name.startswith(f"{CASE}.") or f.name == "noise.json":
            (directory / f.name).write_bytes(f.read_bytes())
    _edit(directory, lambda t: t.__setitem__("quant_output.default", t["quant_output.default"] + 0.5))
    return directory


def _edit(directory: Path, edit) -> None:
    edit_golden(directory, CASE, "tiny", edit)


def _run(report: Path, golden_dir: Path, *extra: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:xdist",
        "-q",
        "--sweep",
        "off",
        "-k",
        f"{CASE} and golden",
        f"--golden-dir={golden_dir}",
        f"--wrapq-report-dir={report}",
        *extra,
    ]
    preloaded_python.run(cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    doc = json.loads((report / "results.json").read_text())
    (record,) = [r for r in doc["results"] if r["check"] == "golden"]
    return {"record": record, "run": doc["run"]}


def test_a_value_that_moved_in_the_base_already_is_not_blamed_on_the_change(tmp_path):
    golden_dir = _moved_golden_dir(tmp_path)
    base = _run(tmp_path / "base", golden_dir)
    assert base["record"]["outcome"] == "failed"  # the base run differs from the committed golden
    assert golden.kept_by_run(tmp_path / "base" / baseline.RUN_GOLDEN_DIR, CASE, "tiny", base["run"]["run_id"])

    head = _run(tmp_path / "head", golden_dir, f"--baseline={tmp_path / 'base'}")
    assert head["record"]["outcome"] == "passed", head["record"]
    assert "base run" in head["record"]["evidence"]["compared_with"]
    assert head["run"]["baseline"]["run_id"] == base["run"]["run_id"]

    # The head's tensors differ from the base's: that is the change's, and red.
    _edit(
        tmp_path / "base" / baseline.RUN_GOLDEN_DIR,
        lambda t: t.__setitem__("quant_output.default", t["quant_output.default"] - 0.5),
    )
    changed = _run(tmp_path / "changed", golden_dir, f"--baseline={tmp_path / 'base'}")
    assert changed["record"]["outcome"] == "failed"
    assert any("compared with the base run" in p for p in changed["record"]["problems"])


def test_without_the_bases_tensors_a_failure_the_base_had_is_pre_existing(tmp_path):
    golden_dir = _moved_golden_dir(tmp_path)
    _run(tmp_path / "base", golden_dir)
    # A golden-run left by another run does not answer for this base: its run id differs.
    manifest_path = golden.paths(tmp_path / "base" / baseline.RUN_GOLDEN_DIR, CASE, "tiny")[1]
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps(dict(manifest, run_id="another-run")))
    head = _run(tmp_path / "head", golden_dir, f"--baseline={tmp_path / 'base'}")
    assert head["record"]["outcome"] == "xfailed", head["record"]
    assert head["record"]["baseline"] == "pre-existing"
    assert any("kept no golden" in n for n in head["record"]["notes"])
    assert head["run"]["baseline"]["pre_existing"] == [head["record"]["nodeid"]]
