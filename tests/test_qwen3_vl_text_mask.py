"""The Qwen3-VL text model's mask forms (the qwen3_vl_text_model mask sweep) and the tico defect they found,
reproduced with the smallest change that removes it (findings/tico.toml: qwen3-vl-text-mask-bitwise-not)."""

from __future__ import annotations

import copy

import pytest
import torch

from cases import qwen3_vl_text
from harness.model.sweep import expand, make_variant
from tests.helpers import problems_text, run_check

TEXT_MODEL = {case.name: case for case in qwen3_vl_text.CASES}["qwen3_vl_text_model"]


def _wrapped_text_model():
    from tico.quantization import prepare
    from tico.quantization.config.ptq import PTQConfig

    torch.manual_seed(0)
    built = qwen3_vl_text.build_text_model("tiny", mask="long_2d")
    return built, prepare(copy.deepcopy(built.module), PTQConfig(), inplace=True).eval()


@pytest.mark.parametrize("form", ["long_2d", "bool_2d", "float_2d", "bool_4d", "float_4d"])
def test_every_mask_form_stands_for_the_same_padding(form):
    """The sweep's premise: each form is the left-padded batch's mask, and HF is given that padding."""
    keys = torch.ones(2, qwen3_vl_text.SEQ, dtype=torch.long)
    keys[1, : qwen3_vl_text.PADDED_TOKENS] = 0
    mask = qwen3_vl_text.text_model_mask(keys, form)
    assert torch.equal(qwen3_vl_text._hf_padding_mask(mask), keys)


def test_a_text_model_that_ignores_the_padding_mask_fails_the_masked_variant(monkeypatch):
    """The left-padded row's valid tokens see the padded keys when the mask is dropped (a realistic mask defect:
    the wrapper keeps only its causal template); quant_accuracy against HF catches it, on the form users pass most."""
    from tico.quantization.wrapq.wrappers.qwen_vl.quant_text_model import QuantQwen3VLTextModel

    variant = expand(TEXT_MODEL, make_variant(TEXT_MODEL.sweep, {"mask": "long_2d"}))
    assert run_check(variant, "quant_accuracy").passed
    original = QuantQwen3VLTextModel._normalize_attention_mask

    def causal_only(self, attention_mask, *, input_embeds, past_key_values):
        return original(self, None, input_embeds=input_embeds, past_key_values=past_key_values)

    monkeypatch.setattr(QuantQwen3VLTextModel, "_normalize_attention_mask", causal_only)
    result = run_check(variant, "quant_accuracy")
    assert not result.passed, problems_text(result)


def test_a_padding_mask_traces_to_bitwise_not_which_circle_conversion_refuses():
    """_normalize_attention_mask inverts the bool keep mask with ~ (aten.bitwise_not); tico serializes
    aten.logical_not but not bitwise_not. The same inversion written as torch.logical_not converts."""
    import tico
    from tico.utils.errors import NotYetSupportedError

    built, wrapped = _wrapped_text_model()
    sample = built.inputs.evaluation["default"]
    args = (sample.kwargs["input_ids"], sample.kwargs["attention_mask"])
    program = torch.export.export(wrapped, args)
    inversions = [n for n in program.graph.nodes if n.target is torch.ops.aten.bitwise_not.default]
    assert inversions and all("_normalize_attention_mask" in n.meta.get("stack_trace", "") for n in inversions)

    class Invert(torch.nn.Module):
        def __init__(self, invert):
            super().__init__()
            self.invert = invert

        def forward(self, keep, x):
            return x.masked_fill(self.invert(keep), -120.0)

    keep, x = torch.tensor([[True, False, True]]), torch.zeros(1, 3)
    with pytest.raises(NotYetSupportedError, match="NOT SUPPORTED OPERATOR"):
        tico.convert(Invert(torch.bitwise_not).eval(), (keep, x))
    converted = tico.convert(Invert(torch.logical_not).eval(), (keep, x))
    assert torch.equal(torch.as_tensor(converted(keep, x)), x.masked_fill(~keep, -120.0))
