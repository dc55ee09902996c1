"""The per-head present-V finding of the Llama decode layer (findings/tico.toml,
finding present-v-per-head-slice), reproduced without the real checkpoint: the tiny decode layer with two
KV heads instead of one shows it, one KV head does not, and the smallest change that removes it is
a SLICE rule in tico's PropagateQParamBackward (the concatenation's qparams then reach the v
projection, the new-K/V replacement the tiny case already expects)."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch

from cases._shared_diagnoses import PRESENT_V_PER_HEAD
from harness import Built, CaseInputs
from tests.helpers import run_check

PRESENT_V_PER_HEAD_PATTERN = PRESENT_V_PER_HEAD.problems[0]


def _decode_layer(kv_heads: int):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    import cases.llama as llama

    base = {case.name: case for case in llama.CASES}["llama_decoder_layer_decode"]

    def build(profile):
        config = llama.llama_config(profile)
        config.num_key_value_heads = kv_heads
        module = LlamaDecoderLayer(config, layer_idx=0)
        calibration = tuple(llama._layer_decode_sample(config, filled) for filled in (15, 11, 6, 2))
        return Built(
            module,
            CaseInputs(calibration=calibration, evaluation={"default": llama._layer_decode_sample(config, 9)}),
            facts={"config": config},
        )

    return base, dataclasses.replace(base, name=f"llama_decoder_layer_decode_kv{kv_heads}", build=build)


def _with_slice_rule(monkeypatch):
    """PropagateQParamBackward as shipped, then its reshape/permute rule once more in the same reverse
    order with aten.slice.Tensor added: a SLICE hands its qparams to its input like a RESHAPE does."""
    from tico.quantization.passes.propagate_qparam_backward import PropagateQParamBackward
    from tico.serialize.quant_param import QPARAM_KEY

    shipped = PropagateQParamBackward.call
    moves = (torch.ops.aten.slice.Tensor, torch.ops.aten.reshape.default, torch.ops.aten.permute.default)

    def call(self, exported_program):
        result = shipped(self, exported_program)
        for node in reversed(exported_program.graph_module.graph.nodes):
            if node.op != "call_function" or node.target not in moves or QPARAM_KEY not in node.meta:
                continue
            source = node.args[0]
            if QPARAM_KEY not in source.meta or source.meta[QPARAM_KEY].dtype == node.meta[QPARAM_KEY].dtype:
                source.meta[QPARAM_KEY] = copy.deepcopy(node.meta[QPARAM_KEY])
        return result

    monkeypatch.setattr(PropagateQParamBackward, "call", call)


def _split(result, base_case):
    """(per-head present-V problem lines, lines the tiny case's expectation does not match)."""
    expected = base_case.expected_failures["qparam_consistency"].problems
    per_head = [p for p in result.problems if re.search(PRESENT_V_PER_HEAD_PATTERN, p)]
    other = [p for p in result.problems if p not in per_head and not any(re.search(e, p) for e in expected)]
    return per_head, other


def test_one_kv_head_has_no_per_head_present_v():
    base, case = _decode_layer(1)
    per_head, other = _split(run_check(case, "qparam_consistency"), base)
    assert per_head == [] and other == [], (per_head, other)


@pytest.mark.parametrize("slice_rule", [False, True], ids=["as_shipped", "with_slice_rule"])
def test_two_kv_heads_show_it_once_per_head_and_a_slice_rule_removes_it(monkeypatch, slice_rule):
    base, case = _decode_layer(2)
    if slice_rule:
        _with_slice_rule(monkeypatch)
    result = run_check(case, "qparam_consistency")
    per_head, other = _split(result, base)
    assert other == [], other
    if not slice_rule:
        assert len(per_head) == 2 and all("quant_attention.py:651" in p for p in per_head), per_head
    else:
        assert per_head == [], per_head
        # the concatenation's qparams now reach the v projection: the new-V replacement the tiny case expects
        assert any(
            re.search(r"v_proj\.wrapped\.obs_act_out\).*replaced by PropagateQParamBackward", p)
            for p in result.problems
        ), result.problems
