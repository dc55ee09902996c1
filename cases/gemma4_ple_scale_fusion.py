"""Gemma4 Per-Layer Embeddings loaded as tico's Gemma4 recipe loads them: the PLE table's scale folded
into its weight before wrapq.

tico's Gemma4 recipe adapter (``recipes/adapters/gemma4.py``, ``load_model``) calls
``fuse_gemma4_ple_embedding_scale`` on the freshly loaded float model whenever
``model_args["text"]["ple_embedding_scale_fusion"]`` is on, its default: ``embed_tokens_per_layer``
becomes a ``FusedGemma4PLEEmbedding`` whose weight already carries ``embed_scale``, and its wrapper
(``QuantGemma4TextScaledWordEmbedding``) then skips the scale multiply. The case runs that load step
the way the recipe does (tico's own reader of the setting, then the fusion on the float model) as an
algorithm before wrapq, on ``gemma4_text_model`` with PLE on. The float reference stays Hugging Face's
unfused model, so every check compares the fused, quantized model with what the user loaded;
``algorithm_gain`` gates the claim that the fused float model computes what the original did, and
``algorithm_handoff`` that the wrapper holds the table times the scale, recomputed here.
"""

from __future__ import annotations

import dataclasses

import torch

from cases import gemma4_text
from harness import AlgorithmCapability, AlgorithmRecord

PLE_WIDTH = 16  # the text-model case's ple=16 variant
_TABLE = "embed_tokens_per_layer"


def _output(result) -> torch.Tensor:
    return result.last_hidden_state if hasattr(result, "last_hidden_state") else result[0]


def recipe_load_step(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
    """The recipe's load-time PLE scale fusion on the float ``module`` (in place), with the table the
    fusion must produce computed independently: HF's table times HF's ``embed_scale``."""
    from tico.quantization.wrapq.wrappers.gemma4.embedding_scale_fusion import (
        fuse_gemma4_ple_embedding_scale,
        gemma4_ple_scale_fusion_enabled,
    )

    table = module.get_submodule(_TABLE)
    expected = table.weight.detach() * table.embed_scale.detach().to(table.weight.dtype)
    with torch.no_grad():
        float_before = [_output(call(module, sample)) for sample in calibration]
    model_args = {"text": {"ple_embedding_scale_fusion": True}}  # the recipe's default, stated
    if not gemma4_ple_scale_fusion_enabled(model_args):
        raise RuntimeError("tico's reader no longer enables PLE scale fusion from model_args.text")
    fused = fuse_gemma4_ple_embedding_scale(module)
    if fused != (_TABLE,):
        raise RuntimeError(f"the fusion replaced {fused}, not the one per-layer table {_TABLE!r}")
    with torch.no_grad():
        float_after = [_output(call(module, sample)) for sample in calibration]
    record = AlgorithmRecord(weights={_TABLE: expected}, original_weights={_TABLE: table.weight.detach().clone()})
    record.float_max_rel_diff = max(
        float((after - ref).abs().max() / ref.abs().max()) for after, ref in zip(float_after, float_before)
    )
    record.facts.update({"fused_modules": list(fused), "embed_scale": float(table.embed_scale)})
    return record


PLE_SCALE_FUSION = AlgorithmCapability(
    name="ple_scale_fusion",
    run=recipe_load_step,
    claims=("float_identity",),
    description="tico's Gemma4 recipe load step: the PLE table's embed_scale folded into its weight "
    "(fuse_gemma4_ple_embedding_scale), then wrapq's PTQConfig",
)

_FUSED_SCALE_UNUSED = (
    "the fused table carries embed_scale in its weight, so the wrapper skips the multiply "
    "(QuantGemma4TextScaledWordEmbedding.forward); it still collects the identity buffer at enable_calibration"
)

_BASE = gemma4_text.TEXT_MODEL
CASES = [
    dataclasses.replace(
        _BASE,
        name="gemma4_ple_scale_fusion_text_model",
        description=PLE_SCALE_FUSION.description,
        build=lambda profile: gemma4_text.build_text_model(profile, ple=PLE_WIDTH),
        algorithm=PLE_SCALE_FUSION,
        sweep=None,
        settings={**_BASE.settings, "quant_accuracy": gemma4_text.TEXT_MODEL_PLE_LIMITS},
        unused_observers={**_BASE.unused_observers, f"{_TABLE}.wrapped.obs_embed_scale": _FUSED_SCALE_UNUSED},
        # the PLE text model's probes and the fusion's refusals run on gemma4_text_model[ple=16] (nightly): the PR
        # gate's budget (docs/benchmarks.md)
        calls=None,
    )
]
