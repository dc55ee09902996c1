"""``python -m harness coverage MODEL``: tiny HF models from their config, prepared with tico,
unwrapped submodules listed. Expectations are checked against tico's registry (``lookup``)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.commands import coverage


def _run_json(capsys, *argv: str) -> dict:
    assert coverage.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _accounted(result: dict) -> int:
    return sum(result["wrapped"].values()) + sum(len(e["paths"]) for e in result["unwrapped"].values())


def test_tiny_qwen3_vl_for_conditional_generation(capsys):
    from tico.quantization.wrapq.wrappers.registry import lookup
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf

    result = _run_json(capsys, "Qwen3VLForConditionalGeneration")
    assert result["model"] == "Qwen3VLForConditionalGeneration" and result["model_type"] == "qwen3_vl"
    unwrapped = result["unwrapped"]
    # tico registers no wrapper for either rotary module (quant_text_model.py says "NOT wrapped");
    # the out-of-tree example registers one for the vision rotary when its case has run in this
    # process, which the vision model wrapper still does not use
    assert lookup(hf.Qwen3VLTextRotaryEmbedding) is None
    for cls, path, owner in (
        (hf.Qwen3VLTextRotaryEmbedding, "model.language_model.rotary_emb", "QuantQwen3VLTextModel"),
        (hf.Qwen3VLVisionRotaryEmbedding, "model.visual.rotary_pos_emb", "QuantQwen3VLVisionModel"),
    ):
        entry = unwrapped[f"{cls.__module__}.{cls.__qualname__}"]
        registered = lookup(cls)
        assert entry["paths"] == [path] and entry["registered_wrapper"] == (registered.__name__ if registered else None)
        assert list(entry["inside"]) == [f"{owner} ({path.rsplit('.', 1)[0]})"]
    # nn.Embedding is registered, but the vision model keeps its pos_embed float (it interpolates it itself)
    pos = unwrapped["torch.nn.modules.sparse.Embedding"]
    assert (
        pos["paths"] == ["model.visual.pos_embed"] and pos["registered_wrapper"] == lookup(torch.nn.Embedding).__name__
    )
    layers = 2  # coverage.TINY["qwen3_vl"] text layers
    assert result["wrapped"]["Qwen3VLTextAttention -> QuantQwen3VLTextAttention"] == layers
    assert lookup(hf.Qwen3VLTextAttention).__name__ == "QuantQwen3VLTextAttention"
    assert result["wrapped"]["Qwen3VLForConditionalGeneration -> QuantQwen3VLForConditionalGeneration"] == 1
    containers = result["float_modules"] - _accounted(result)
    assert 0 < containers < 10  # only ModuleLists are left out


def test_tiny_gemma4_model(capsys):
    from tico.quantization.wrapq.wrappers.registry import lookup
    from transformers.activations import GELUTanh
    from transformers.models.gemma4 import modeling_gemma4 as hf

    result = _run_json(capsys, "gemma4")
    assert result["model"] == "Gemma4Model"
    assert "build_gemma4_e2b_ptq_config" in result["ptq_config"]
    unwrapped = result["unwrapped"]
    # GELUTanh has a registered wrapper, but the MLP wrappers keep act_fn float and fake-quantize
    # its output themselves (gemma4/quant_text_mlp.py: self.act_fn = fp_mlp.act_fn, obs_gate_act)
    gelu = unwrapped["transformers.activations.GELUTanh"]
    assert gelu["registered_wrapper"] == lookup(GELUTanh).__name__ == "QuantGELUTanh"
    assert sorted(gelu["paths"]) == [
        "language_model.layers.0.mlp.act_fn",
        "language_model.layers.1.mlp.act_fn",
        "vision_tower.encoder.layers.0.mlp.act_fn",
    ]
    assert lookup(hf.Gemma4TextRotaryEmbedding) is None
    assert unwrapped["transformers.models.gemma4.modeling_gemma4.Gemma4TextRotaryEmbedding"]["paths"] == [
        "language_model.rotary_emb"
    ]
    assert result["wrapped"]["Gemma4TextMLP -> QuantGemma4TextMLP"] == 2
    assert result["wrapped"]["Gemma4Model -> QuantGemma4Model"] == 1
    assert "<root>" not in {p for e in unwrapped.values() for p in e["paths"]}


def test_unsupported_root_lists_the_float_region(capsys):
    """A family tico has no wrappers for: the root and its blocks run in float, Linear is wrapped."""
    from tico.quantization.wrapq.wrappers.registry import lookup
    from transformers.models.mistral.modeling_mistral import MistralModel

    assert lookup(MistralModel) is None
    result = _run_json(capsys, "mistral")
    root = result["unwrapped"]["transformers.models.mistral.modeling_mistral.MistralModel"]
    assert root["paths"] == ["<root>"] and root["inside"] == {"no wrapper (runs in float)": 1}
    assert result["wrapped"]["Linear -> QuantLinear"] == 7 * 2  # q k v o gate up down, 2 layers


def test_text_output_tabulates(capsys):
    assert coverage.main(["llama"]) == 0
    out = capsys.readouterr().out
    assert "| LlamaRotaryEmbedding |" in out and "QuantLlamaModel (<root>)" in out
    assert "LlamaDecoderLayer -> QuantLlamaDecoderLayer" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["qwen3vl"], "unknown model 'qwen3vl'"),
        (["NotAModelClass"], "unknown model 'NotAModelClass'"),
        (["llama", "--set", "vision_config.depth=1"], "has no sub-config 'vision_config'"),
    ],
)
def test_bad_input_exits_2_with_the_reason(capsys, argv, message):
    assert coverage.main(argv) == 2
    assert message in capsys.readouterr().err
