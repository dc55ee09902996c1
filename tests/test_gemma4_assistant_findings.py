"""Finding gemma4-assistant-sparse-head-signed-weight, reproduced on the nightly variant
gemma4_assistant_core[lm_head=int8_symm]: tico's sparse-head export casts the LM head's clamped
integers to uint8 whatever the weight dtype (recipes/export/gemma4_assistant.py,
_quantized_lm_head_payload), so a signed spec's negative integers wrap and the host head's logits are
not the wrapper's. Keeping the integers in int8 (the one change) makes the host head replay the wrapper."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
import torch

from cases import gemma4_assistant as ga
from harness import unwrap
from harness.model.sweep import expand, make_variant
from harness.pipeline import Pipeline

CORE = {case.name: case for case in ga.CASES}["gemma4_assistant_core"]


@pytest.fixture(scope="module")
def signed_assistant():
    variant = expand(CORE, make_variant(CORE.sweep, {"lm_head": "int8_symm"}))
    return unwrap(copy.deepcopy(Pipeline(variant, "tiny").quantized))


def _host_logits(assistant, hidden) -> tuple[torch.Tensor, dict]:
    from tico.quantization.recipes.export.gemma4_assistant import export_gemma4_assistant_sparse_head
    from tico.quantization.wrapq.wrappers.gemma4_assistant.sparse_head import Gemma4AssistantSparseHead

    with tempfile.TemporaryDirectory() as scratch:
        artifact = torch.load(export_gemma4_assistant_sparse_head(assistant, Path(scratch)), weights_only=True)
    head = Gemma4AssistantSparseHead.from_artifact(artifact)
    return head.full_logits(hidden, assistant.masked_embedding.forward_centroid_logits(hidden)), artifact


def test_signed_lm_head_integers_wrap_and_int8_storage_fixes_it(signed_assistant, monkeypatch):
    from tico.quantization.recipes.export import gemma4_assistant as recipe

    observer = signed_assistant.lm_head.wrapped.obs_weight
    assert observer.dtype.qmin < 0  # the variant's spec is signed
    hidden = torch.rand(1, 3, signed_assistant.masked_embedding.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        wrapper = signed_assistant.masked_embedding(hidden - 0.5, signed_assistant._lm_head_weight())

    with torch.no_grad():
        host, artifact = _host_logits(signed_assistant, hidden - 0.5)
    assert artifact["lm_head_weight_int"].dtype == torch.uint8
    assert int(artifact["lm_head_weight_int"].max()) > observer.dtype.qmax  # -1 stored as 255, ...
    assert float((host - wrapper).abs().max()) > 0.1

    original = recipe._quantized_lm_head_payload

    def signed_storage(assistant):
        payload = original(assistant)
        weight = assistant.lm_head.wrapped.module.weight.detach()
        scale, zero_point = payload["lm_head_weight_scale"][:, None], payload["lm_head_weight_zero_point"][:, None]
        payload["lm_head_weight_int"] = torch.clamp(torch.round(weight / scale) + zero_point, -128, 127).to(torch.int8)
        return payload

    monkeypatch.setattr(recipe, "_quantized_lm_head_payload", signed_storage)
    with torch.no_grad():
        fixed, _ = _host_logits(signed_assistant, hidden - 0.5)
    torch.testing.assert_close(fixed, wrapper, atol=1e-5, rtol=1e-5)
