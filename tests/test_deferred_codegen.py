"""Deferred FX code generation during tico's conversion (harness/export/stages.py): the Circle bytes
and the audited quantized graph equal tico's own conversion, the per-pass code generation is
really skipped, and a graph whose code cannot be generated still fails conversion."""

from __future__ import annotations

import pytest
import torch

from cases.gemma4_vision_tower import CASES as GEMMA4_TOWER_CASES
from cases.llama import CASES as LLAMA_CASES
from cases.nn import CASES as NN_CASES
from harness.export.circle_conversion import convert_with_audit, counting_codegens
from harness.pipeline import Pipeline

CASES = {case.name: case for case in [*NN_CASES, *LLAMA_CASES, *GEMMA4_TOWER_CASES]}


def _program(name: str):
    return Pipeline(CASES[name], "tiny").exported_program


# A linear layer, a decoder layer (rotary, mask, attention, MLP), a Conv patch embedder.
@pytest.mark.parametrize("name", ["nn_linear", "llama_decoder_layer_prefill", "gemma4_vision_patch_embedder"])
def test_deferred_conversion_equals_tico_conversion(name):
    program = _program(name)
    as_tico_does, deferred = (
        convert_with_audit(program, defer_codegen=False),
        convert_with_audit(program, defer_codegen=True),
    )
    assert deferred[0] == as_tico_does[0]
    assert deferred[1] == as_tico_does[1]


def test_deferral_skips_the_per_pass_code_generation():
    program = _program("llama_decoder_layer_prefill")
    with counting_codegens() as as_tico_does:
        convert_with_audit(program, defer_codegen=False)
    with counting_codegens() as deferred:
        convert_with_audit(program, defer_codegen=True)
    assert as_tico_does[0] > 50, as_tico_does
    assert deferred[0] < as_tico_does[0] / 5, (deferred, as_tico_does)


def test_a_graph_whose_code_cannot_be_generated_still_fails_conversion(monkeypatch):
    """Code generation breaks once tico's quantization passes start. As tico runs them, the
    next recompile() fails; under deferral no pass generates code, so only the final compile
    can see it (this test fails with that compile removed)."""
    from tico.quantization.passes.fold_quant_ops import FoldQuantOps

    program = _program("nn_linear")
    armed = [False]
    original_codegen, original_fold = torch.fx.Graph.python_code, FoldQuantOps.call

    def codegen(self, *args, **kwargs):
        if armed[0]:
            raise SyntaxError("injected: this graph's code cannot be generated")
        return original_codegen(self, *args, **kwargs)

    def fold_then_arm(self, exported_program):
        armed[0] = True
        return original_fold(self, exported_program)

    monkeypatch.setattr(torch.fx.Graph, "python_code", codegen)
    monkeypatch.setattr(FoldQuantOps, "call", fold_then_arm)
    for defer in (False, True):
        armed[0] = False
        with pytest.raises(SyntaxError, match="injected"):
            convert_with_audit(program, defer_codegen=defer)
