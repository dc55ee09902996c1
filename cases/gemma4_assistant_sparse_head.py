"""Gemma4 assistant ordered sparse LM head (``Gemma4AssistantMaskedEmbedder`` ->
``QuantGemma4AssistantMaskedEmbedder``): top-k centroids, token-ordering gather and the
full-vocabulary scatter, which tico keeps on the host and never exports; compared with Hugging
Face's module on TICO's tiny assistant config (``cases/gemma4_assistant.py`` holds the core)."""

from __future__ import annotations

import torch

from cases._gemma4_assistant_common import (
    ASSISTANT_MIN_VERSIONS,
    ASSISTANT_REQUIRES,
    assistant_config,
    random_token_ordering,
)
from harness import Built, Case, CaseInputs, Sample


def build_sparse_head(profile: str) -> Built:
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantMaskedEmbedder

    config = assistant_config(profile)
    text = config.get_text_config()
    module = Gemma4AssistantMaskedEmbedder(config)
    random_token_ordering(module)
    lm_head_weight = torch.randn(text.vocab_size, text.hidden_size)
    sample = lambda positions=1: Sample(args=(torch.randn(1, positions, text.hidden_size), lm_head_weight))  # noqa: E731
    # TICO's draft-one shape, plus 16 positions at once to exercise more top-k selections
    evaluation = {"default": sample(), "positions16": sample(16)}
    return Built(module, CaseInputs(calibration=tuple(sample() for _ in range(4)), evaluation=evaluation))


_HOST_ONLY = (
    "the ordered sparse head is host-side by design and has no export path: TICO's smoke case sets "
    "supports_circle_export=False because 'the ordered sparse head runs on the host: dynamic top-k, "
    "token-ordering gathers, and the full-vocabulary scatter are intentionally excluded from the NPU core "
    "graph' (wrapper_smoke/cases/gemma4_assistant.py), and QuantGemma4AssistantMaskedEmbedder says those "
    "host operations 'must never be exported'; the exportable part (centroid logits) is checked in "
    "gemma4_assistant_core"
)

CASES = [
    Case(
        name="gemma4_assistant_sparse_head",
        family="gemma4_assistant",
        build=build_sparse_head,
        seed=2028,
        requires=ASSISTANT_REQUIRES,
        min_versions=ASSISTANT_MIN_VERSIONS,
        expected_wrapper="QuantGemma4AssistantMaskedEmbedder",
        # Only the centroid projection is quantized and the selected logits are float, so the output is HF's:
        # any selection flip would show as a large jump (docs/case-measurements.md#gemma4_assistant_sparse_head)
        settings={"quant_accuracy": {"max_mean_abs_diff": 1e-6, "max_abs_diff": 1e-6, "max_peir": 1e-6}},
        not_applicable={
            check: _HOST_ONLY
            for check in (
                "dynamic_vs_export",
                "torch_export",
                "circle_call",
                "circle_replay",
                "circle_structure",
                "qparam_audit",
                "qparam_consistency",
                "export_contract",
            )
        },
    ),
]
