"""What the configuration sweeps found on tico 0.3.0, each reproduced with the smallest change that
removes it (the precise expectations on exactly those variants: cases/llama.py, cases/nn.py)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from cases.llama import _reference_eval_config, build_attention
from cases.nn import CASES as NN_CASES
from harness.model.sweep import expand, make_variant
from tests.helpers import run_check


def _new_kv_observed(layout: str, use_cache: bool) -> dict[str, bool]:
    """Calibrate the GQA attention through prefill calls and say which new-K/V observers saw data."""
    from tico.quantization import prepare

    torch.manual_seed(0)
    built = build_attention("tiny", heads=4, kv_heads=2)
    model = prepare(copy.deepcopy(built.module), _reference_eval_config("tiny", layout=layout), inplace=True)
    with torch.no_grad():
        for sample in built.inputs.calibration:
            model(*sample.args, **dict(sample.kwargs, use_cache=use_cache))
    attention = model.wrapped
    return {name: math.isfinite(float(getattr(attention, name).min_val)) for name in ("obs_new_k", "obs_new_v")}


def test_unrolled_layout_calibrates_new_kv_only_with_use_cache():
    # The finding: unrolled prefill without use_cache leaves obs_new_k / obs_new_v unobserved ...
    assert _new_kv_observed("unrolled", use_cache=False) == {"obs_new_k": False, "obs_new_v": False}
    # ... while the batched layout observes them on the same calls (quant_attention.py:946-947),
    assert _new_kv_observed("batched", use_cache=False) == {"obs_new_k": True, "obs_new_v": True}
    # and use_cache=True, which reaches _finalize_cache_output (:884, :672-673), removes it.
    assert _new_kv_observed("unrolled", use_cache=True) == {"obs_new_k": True, "obs_new_v": True}


def _linear_variant(policy: str):
    case = next(c for c in NN_CASES if c.name == "nn_linear")
    return expand(case, make_variant(case.sweep, {"policy": policy}))


def test_int16_output_after_uint8_input_is_requantized_on_a_uint8_grid():
    from tico.quantization.passes.insert_quantize_on_dtype_mismatch import _i16_to_u8
    from tico.serialize.quant_param import QuantParam

    # tico's own conversion of the int16 qparams: +-32767 steps spread over 255 uint8 levels.
    q16 = QuantParam()
    q16.scale, q16.zero_point, q16.dtype = [1e-4], [0], "int16"
    q8 = _i16_to_u8(q16)
    assert q8.dtype == "uint8" and q8.scale[0] / q16.scale[0] == pytest.approx(2 * 32767 / 255)
    # The variant: Circle's output is many int16 steps off torch (the expectation gates how) ...
    gap = run_check(_linear_variant("act_out_int16"), "circle_replay")
    assert gap.metrics["fake_quantize_max_steps"] > 32, gap.metrics
    # ... and with the input int16 too there is no dtype mismatch, no inserted Quantize: within a step.
    import dataclasses

    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT16

    both = dataclasses.replace(
        _linear_variant("act_out_int16"),
        ptq_config=lambda profile: PTQConfig(overrides={"act_in": affine(INT16), "act_out": affine(INT16)}),
        expected_failures={},
    )
    aligned = run_check(both, "circle_replay")
    assert aligned.metrics["fake_quantize_max_steps"] <= 1.0, aligned.metrics


def test_unrolled_layout_broadcasts_a_4d_mask_across_the_batch():
    from tico.quantization import prepare

    def run(layout: str, four_d: bool):
        torch.manual_seed(0)
        built = build_attention("tiny", mask="additive_4d")
        model = prepare(copy.deepcopy(built.module), _reference_eval_config("tiny", layout=layout), inplace=True)
        sample = built.inputs.evaluation["default"]
        mask = sample.kwargs["attention_mask"]
        with torch.no_grad():
            return model(*sample.args, attention_mask=mask if four_d else mask.squeeze(1))

    # HF's (B, 1, S, S) mask with batch 2: each head's logits broadcast to (B, B, S, K), o_proj refuses.
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        run("unrolled", four_d=True)
    # The same mask as (B, S, S), or the batched layout (which keeps a 4-D mask), runs.
    assert run("unrolled", four_d=False)[0].shape == (2, 6, 16)
    assert run("batched", four_d=True)[0].shape == (2, 6, 16)


def test_quantize_bias_refuses_a_per_tensor_weight():
    from harness.primitives.stage_engine import StageError

    case = next(c for c in NN_CASES if c.name == "nn_linear")
    per_tensor = expand(case, make_variant(case.sweep, {"policy": "per_tensor_weight", "bias": True}))
    with pytest.raises(StageError, match=r"stage 'circle_convert' failed: AssertionError"):
        run_check(per_tensor, "qparam_audit")
    # Per-channel weights (the default) with the same bias convert, and so does the per-tensor weight without one.
    assert run_check(expand(case, make_variant(case.sweep, {"bias": True})), "qparam_audit").passed
    assert run_check(_linear_variant("per_tensor_weight"), "qparam_audit").passed


def test_ple_decode_loss_is_the_ple_product_clipped_by_single_token_calibration():
    """gemma4_text_decoder_layer_decode[tiny,ple=16] loses ~7 dB more than with PLE off: its 3
    single-token calibration steps give the PLE product (obs_per_layer_mul, and per_layer_projection's
    input observer on the same tensor) a range the evaluation token exceeds; with those two fake-quants
    off the loss is the PLE-off layer's again."""
    from cases.gemma4_text import DECODER_LAYERS
    from harness.pipeline import Pipeline

    case = next(c for c in DECODER_LAYERS if c.name == "gemma4_text_decoder_layer_decode")
    case = expand(case, make_variant(case.sweep, {"ple": 16}))
    torch.manual_seed(case.seed)
    pipeline = Pipeline(case, "tiny")
    reference = pipeline.output("reference", "default")
    quantized, sample = pipeline.quantized, pipeline.sample("default")

    def sqnr(switched_off=()) -> float:
        saved = [(m, m.fake_quant) for m in switched_off]
        for m in switched_off:
            m.fake_quant = lambda t: t
        try:
            with torch.no_grad():
                out = case.output(sample.call(quantized))
        finally:
            for m, fake_quant in saved:
                m.fake_quant = fake_quant
        return float(10 * torch.log10(reference.pow(2).sum() / (out - reference).pow(2).sum()))

    layer = quantized.wrapped
    product_observers = (layer.obs_per_layer_mul, layer.per_layer_projection.wrapped.obs_act_in)
    # the two observers hold one calibrated range (they quantize one tensor) ...
    assert float(product_observers[0].max_val) == float(product_observers[1].max_val)
    # ... which the evaluation token's product exceeds
    seen: dict = {}
    hook = pipeline.wrapped.wrapped.per_layer_projection.register_forward_hook(
        lambda module, args, out: seen.update(product=args[0].detach())
    )
    with torch.no_grad():
        sample.call(pipeline.wrapped)
    hook.remove()
    assert float(seen["product"].max()) > float(product_observers[0].max_val)
    as_is, without_clip = sqnr(), sqnr(product_observers)
    assert without_clip - as_is > 6.0, (as_is, without_clip)
    # either observer alone still clips the tensor: one off recovers little
    assert sqnr(product_observers[:1]) - as_is < 1.0
