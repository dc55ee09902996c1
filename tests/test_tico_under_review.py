"""The harness on real tico changes: modified copies of the installed tico imported first, as a
TICO checkout under review is (scripts/env.sh's WRAPQ_TICO=<dir> puts the tree in front the same way).

(a) behaviour-neutral: comment lines at the top of every file under tico/quantization, the whole
    package at another path -> no failed item, every finding still open;
(b) one finding fixed (a SLICE rule in PropagateQParamBackward) -> that finding fixed on exactly
    its items, exit 0; with --strict-findings the same run is red;
(c) a realistic regression (QuantLinear stops fake-quantizing its output) -> red, with the diagnosis;
(d) an identical copy at another path -> the recorded tico, judged strictly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records import node_ids
from tests.tico_tree import copy_tico, edit, run_harness

# Cases that declare findings on many checks (their declared configurations; the sweep variants add
# nothing these tests read), plus the decode layer whose kv_heads=2 variant shows
# present-v-per-head-slice at tiny, plus nn_linear for the regression.
SELECTION = (
    "cases/llama.py::llama_attention_prefill[tiny]",
    "cases/llama.py::llama_decoder_layer_prefill[tiny]",
    "cases/llama.py::llama_decoder_layer_decode[tiny]",
    "cases/llama.py::llama_decoder_layer_decode[tiny,kv_heads=2]",
    "cases/nn.py::nn_linear[tiny]",
)
_copy_tico = copy_tico
_edit = edit


def _run(
    tree: Path | None,
    tmp_path: Path,
    *extra: str,
    selection: tuple[str, ...] = SELECTION,
    caches: bool | Path = False,
) -> tuple[int, dict, str]:
    """The selection under pytest with ``tree`` first on the path; (exit code, results.json, output)."""
    return run_harness(tree, tmp_path, *selection, *extra, caches=caches)


def _outcomes(results: dict) -> dict[str, str]:
    return {r["nodeid"]: r["outcome"] for r in results["results"]}


def _statuses(results: dict) -> dict[str, dict]:
    return {f["id"]: f for f in results["run"]["findings"]}


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """The selection on the installed (recorded) tico with the project's caches, as the main job runs it: the
    verdicts the other trees, converted cold, are read against (the caches are sound: tests/test_cache_soundness.py)."""
    tmp = tmp_path_factory.mktemp("pinned")
    code, results, output = _run(None, tmp, caches=True)
    assert code == 0, output[-3000:]
    assert results["run"]["findings_strict"] is True
    return results


def test_an_identical_copy_elsewhere_is_judged_as_the_recorded_tico(tmp_path):
    tree = _copy_tico(tmp_path, "pinned_copy")  # identical sources at another path: recorded, judged strictly
    code, results, output = run_harness(tree, tmp_path, "cases/nn.py::nn_linear[tiny]")
    assert code == 0, output[-3000:]
    assert results["run"]["tico"]["location"] == str(tree / "tico")
    assert results["run"]["findings_strict"] is True


def test_a_behaviour_neutral_tree_changes_no_verdict(tmp_path, pinned):
    tree = _copy_tico(tmp_path, "neutral")
    for path in (tree / "tico" / "quantization").rglob("*.py"):
        path.write_text("# a line added above everything\n# and another\n" + path.read_text())
    code, results, output = _run(tree, tmp_path, "--strict-findings")
    assert code == 0, output[-3000:]
    assert results["run"]["tico"]["location"] == str(tree / "tico")
    assert results["run"]["tico"]["source_sha256"] != pinned["run"]["tico"]["source_sha256"]
    assert _outcomes(results) == _outcomes(pinned)
    assert {fid: f["status"] for fid, f in _statuses(results).items()} == {
        fid: f["status"] for fid, f in _statuses(pinned).items()
    }


def _slice_rule(tree: Path) -> None:
    _edit(
        tree,
        "quantization/passes/propagate_qparam_backward.py",
        "            # TODO Support more ops.",
        "            elif node.target == torch.ops.aten.slice.Tensor:\n"
        "                _propagate_qparam_if_possible(node, node.args[0])\n"
        "            # TODO Support more ops.",
    )


def test_a_fixed_finding_is_reported_fixed_on_exactly_its_items(tmp_path, pinned):
    tree = _copy_tico(tmp_path, "slice_rule")
    _slice_rule(tree)
    tree_caches = tmp_path / "tree-caches"  # this tree's own: the strict run below reads its conversions
    code, results, output = _run(tree, tmp_path, caches=tree_caches)
    assert code == 0, output[-3000:]
    assert results["run"]["findings_strict"] is False
    statuses = _statuses(results)
    fixed = {fid: f for fid, f in statuses.items() if f["status"] == "fixed"}
    assert set(fixed) == {"present-v-per-head-slice"}, statuses
    was = _statuses(pinned)["present-v-per-head-slice"]
    assert sorted(fixed["present-v-per-head-slice"]["fixed"]) == sorted(was["occurs"])
    assert "fixed  present-v-per-head-slice" in output
    # the other findings on those items still occur: their items stay expected failures
    assert _outcomes(results) == _outcomes(pinned)
    # strict: red; the finding's own groups are enough to show it
    groups = {
        node_ids.group_of(r["nodeid"])
        for r in pinned["results"]
        if "present-v-per-head-slice" in (r.get("findings") or {})
    }
    assert groups
    strict_code, _, strict_output = _run(
        tree, tmp_path, "--strict-findings", selection=tuple(sorted(groups)), caches=tree_caches
    )
    assert strict_code == 1 and "expected problem(s) no longer occur" in strict_output, strict_output[-3000:]


def test_a_regression_is_red_with_its_diagnosis(tmp_path):
    tree = _copy_tico(tmp_path, "no_output_fake_quant")
    _edit(
        tree,
        "quantization/wrapq/wrappers/nn/quant_linear.py",
        "        return self._fq(out, self.obs_act_out)",
        "        return out",
    )
    code, results, output = run_harness(tree, tmp_path, "-k", "nn_linear")  # the regressed wrapper's cases
    assert code == 1, output[-3000:]
    failed = {r["check"] for r in results["results"] if r["outcome"] == "failed" and r["case"] == "nn_linear"}
    assert {"observer_use", "calibration_coverage"} <= failed, failed
    messages = "\n".join(r.get("message", "") for r in results["results"] if r["outcome"] == "failed")
    assert "obs_act_out" in messages
    assert any(p["where"].startswith("nn_linear[") for p in results["run"]["new_problems"])
