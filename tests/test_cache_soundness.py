"""A cached conversion or audit is never served to code that differs from the code that produced
it, also when that code is patched in memory: with warm caches, a patch to (a) a conversion
pass, (b) the harness's qparam audit, (c) an observer method or (d) a wrapper's forward is a
miss and its defect is reported exactly as a cold run reports it; a patch conversion cannot
reach stays a hit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from cases.nn import CASES as NN_CASES
from cases.qwen3_vl import CASES as QWEN_VISION_CASES
from harness.checks import all_checks
from harness.export.circle_cache import conversion_code_fingerprint
from harness.pipeline import Pipeline, RunSettings
from harness.records import node_ids
from tests import preloaded_python
from tests.pass_defects import dropping_split_output_qparams

# the caches, their keys and traces are what these tests read: no stage is shared (tests/stage_sharing.py)
pytestmark = pytest.mark.fresh_stages

REPO = Path(__file__).resolve().parents[1]
CHECKS = {check.name: check for check in all_checks()}
LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")
# The smallest qwen3_vl vision graph whose rotary halves come out of split_with_sizes (the qparams the pass
# patch drops).
VISION_ATTENTION = next(c for c in QWEN_VISION_CASES if c.name == "qwen3_vl_vision_attention")


def _pipeline(case, cache: Path | None) -> Pipeline:
    settings = (
        RunSettings(circle_cache_dir=cache / "circle", export_cache_dir=cache / "export") if cache else RunSettings()
    )
    return Pipeline(case, "tiny", settings=settings)


def _verdict(case, check: str, cache: Path | None) -> tuple[bool, list[str], str]:
    pipeline = _pipeline(case, cache)
    result = CHECKS[check].run(pipeline)
    return result.passed, result.problems, pipeline.circle.cache_status


def _drop_split_output_qparams(monkeypatch) -> None:
    from tico.quantization.passes import propagate_qparam_forward as forward

    monkeypatch.setattr(
        forward.PropagateQParamForward, "call", dropping_split_output_qparams(forward.PropagateQParamForward.call)
    )


def test_a_pass_patched_in_memory_is_a_miss_and_fails_as_cold(tmp_path, monkeypatch):
    warm = _verdict(VISION_ATTENTION, "qparam_audit", tmp_path)
    assert warm[0] and warm[2] == "miss", warm
    assert _verdict(VISION_ATTENTION, "qparam_audit", tmp_path)[2] == "hit"
    _drop_split_output_qparams(monkeypatch)
    patched = _verdict(VISION_ATTENTION, "qparam_audit", tmp_path)
    cold = _verdict(VISION_ATTENTION, "qparam_audit", None)
    assert patched[2] == "miss" and not patched[0]
    assert patched[:2] == cold[:2]
    assert any("getitem" in problem and "has no qparam" in problem for problem in patched[1]), patched[1]


def test_the_harness_audit_patched_in_memory_is_a_miss(tmp_path, monkeypatch):
    from harness.circle import missing_qparams as qparam_audit

    assert _verdict(LINEAR, "qparam_audit", tmp_path)[0]
    assert _verdict(LINEAR, "qparam_audit", tmp_path)[2] == "hit"
    # A defect in the audit itself: every float tensor counted as integer (nothing is checked).
    monkeypatch.setattr(qparam_audit, "_is_float_tensor", lambda node: False)
    patched = _verdict(LINEAR, "qparam_audit", tmp_path)
    cold = _verdict(LINEAR, "qparam_audit", None)
    assert patched[2] == "miss" and patched[:2] == cold[:2]
    assert not patched[0] and "no quantized node" in " ".join(patched[1])


def test_an_observer_method_patched_in_memory_is_a_miss(tmp_path, monkeypatch):
    from tico.quantization.wrapq.observers.affine_base import AffineObserverBase

    assert _verdict(LINEAR, "circle_replay", tmp_path)[2] == "miss"
    original = AffineObserverBase.fake_quant

    def shifted(self, x):  # a zero point off by one, in torch only after calibration
        out = original(self, x)
        return out + self._cached_scale.to(out.device).reshape(-1)[0] if self.has_qparams else out

    monkeypatch.setattr(AffineObserverBase, "fake_quant", shifted)
    pipeline = _pipeline(LINEAR, tmp_path)
    CHECKS["circle_replay"].run(pipeline)
    assert pipeline.export_record.status == "miss"
    assert pipeline.circle.cache_status == "miss"


def test_a_wrapper_forward_patched_in_memory_is_a_miss_and_fails_as_cold(tmp_path, monkeypatch):
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    assert _verdict(LINEAR, "qparam_audit", tmp_path)[0]
    original = QuantLinear.forward

    def forward_without_output_fq(self, x):
        if torch.compiler.is_compiling():
            return torch.nn.functional.linear(self.obs_act_in.fake_quant(x), self.module.weight, self.module.bias)
        return original(self, x)

    monkeypatch.setattr(QuantLinear, "forward", forward_without_output_fq)
    patched = _verdict(LINEAR, "qparam_audit", tmp_path)
    cold = _verdict(LINEAR, "qparam_audit", None)
    assert patched[2] == "miss" and patched[:2] == cold[:2] and not patched[0]


def test_a_patch_conversion_cannot_reach_stays_a_hit(tmp_path, monkeypatch):
    from tico.circle.runtime import executor

    assert _verdict(LINEAR, "qparam_audit", tmp_path)[2] == "miss"
    before = conversion_code_fingerprint()
    # The reference runtime replays Circle models; conversion never calls it.
    monkeypatch.setattr(executor.CircleReferenceRuntime, "run", lambda self, *a, **k: None)
    assert conversion_code_fingerprint() == before
    assert _verdict(LINEAR, "qparam_audit", tmp_path)[2] == "hit"


def test_code_that_cannot_be_fingerprinted_refuses_the_cache(tmp_path, monkeypatch):
    from harness.circle import missing_qparams as qparam_audit

    class Opaque:
        """A callable the walk cannot describe (its description fails)."""

        __module__ = "harness.opaque"

        def __getattribute__(self, name):
            raise RuntimeError("no introspection")

        def __call__(self, node):
            return qparam_audit.__dict__["_is_float_tensor_original"](node)

    monkeypatch.setattr(qparam_audit, "_is_float_tensor_original", qparam_audit._is_float_tensor, raising=False)
    monkeypatch.setattr(qparam_audit, "_is_float_tensor", Opaque())
    passed, problems, status = _verdict(LINEAR, "qparam_audit", tmp_path)
    assert passed, problems  # the verdict is computed, only without the cache
    assert status.startswith("uncacheable: the conversion code cannot be fingerprinted"), status
    assert "missing_qparams._is_float_tensor" in status


def _audit_failures(tmp_path: Path, cache: bool, plugin: bool) -> tuple[int, set[str]]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-n",
        "0",
        "-k",
        "qparam_audit and ({})".format(" or ".join(sorted(c.split("[")[0] for c in SPLITTING | NOT_SPLITTING))),
        f"--wrapq-report-dir={tmp_path / 'reports'}",
    ]
    cmd += (
        [f"--circle-cache={tmp_path / 'circle'}", f"--export-cache={tmp_path / 'export'}"]
        if cache
        else ["--no-circle-cache", "--no-export-cache"]
    )
    if plugin:
        cmd += ["-p", "tests.patched_pass_plugin"]
    done = preloaded_python.run(cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    failed = {
        node_ids.group_of(line.split()[1]).split("::")[1]
        for line in done.stdout.splitlines()
        if line.startswith("FAILED ")
    }
    return done.returncode, failed


# Two cases whose graphs split (the patched pass drops those outputs' qparams), one of each vision family, and
# one that does not: the smallest of the vision cases, each converted three times below.
SPLITTING = {"qwen3_vl_vision_attention[tiny]", "gemma4_vision_attention[tiny]"}
NOT_SPLITTING = {"qwen3_vl_vision_mlp[tiny]"}


def test_a_plugin_patching_a_pass_fails_the_warm_run_as_the_cold_one(tmp_path):
    """The issue's scenario end to end: warm caches, then a plugin patching the pass in memory."""
    assert _audit_failures(tmp_path, cache=True, plugin=False) == (0, set())
    warm = _audit_failures(tmp_path, cache=True, plugin=True)
    cold = _audit_failures(tmp_path, cache=False, plugin=True)
    assert warm == cold == (1, SPLITTING), (warm, cold)


@pytest.mark.parametrize("check", ["circle_replay", "qparam_consistency"])
def test_a_warm_cache_gives_the_cold_verdict_on_a_replay_the_alignment_explains(tmp_path, check):
    """The audit a Circle cache hit hands back went through JSON (lists where the live audit has
    tuples): the replay alignment built from it must judge as the one built from a fresh
    conversion. Seen failing before the fix: llama_attention_prefill's alignment was refused on
    a warm run ('call 0 of aten.neg.default has shape (1, 2, 16, 4), the graph's neg [1, 2, 16, 4]')."""
    from cases.llama import CASES as LLAMA_CASES

    case = next(c for c in LLAMA_CASES if c.name == "llama_attention_prefill")
    cold = _verdict(case, check, None)
    first = _verdict(case, check, tmp_path)
    warm = _verdict(case, check, tmp_path)
    assert first[2] == "miss" and warm[2] == "hit", (first, warm)
    assert warm[:2] == cold[:2] == first[:2], (cold, first, warm)
