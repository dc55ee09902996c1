"""Finding llama-model-2d-padding-mask, reproduced on the tiny llama_model case (diagnosed on
the real_weights profile): a bool/int mask is added to the (1, 1, S, S) causal template as given
(llama/quant_model.py:483-486), so HF's (B, S) padding mask broadcasts as a (query, key) matrix.
It raises for 1 < B != S and silently mis-masks for B == S; the (B, 1, S) form the cases feed is
the smallest change that removes it (one key row per batch row, broadcast over the queries)."""

from __future__ import annotations

import pytest
import torch
from tico.quantization.config.ptq import PTQConfig

from cases import llama_model as lm
from harness.primitives.lifecycle_ops import wrap_noquant
from harness.primitives.metrics import select_valid

MODEL = {case.name: case for case in lm.CASES}["llama_model"]


def _models(batch: int):
    from transformers.models.llama.modeling_llama import LlamaModel

    torch.manual_seed(0)
    reference = LlamaModel(lm.model_config("tiny")).eval()
    wrapped = wrap_noquant(MODEL, reference, PTQConfig()).eval()
    ids, mask = lm.token_batch(batch, lm.WINDOW, [lm.WINDOW] + [lm.PADDED_LENGTH] * (batch - 1))
    with torch.no_grad():
        hf = reference(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return wrapped, ids, mask, hf


def _run(wrapped, ids, mask):
    with torch.no_grad():
        return wrapped(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def test_hf_padding_mask_raises_when_batch_differs_from_length():
    wrapped, ids, mask, _ = _models(2)
    with pytest.raises(RuntimeError, match="must match the size"):
        _run(wrapped, ids, mask.to(torch.bool))


def test_hf_padding_mask_mis_masks_when_batch_equals_length_and_b1s_fixes_it():
    wrapped, ids, mask, hf = _models(lm.WINDOW)
    valid = mask.to(torch.bool)
    as_hf = _run(wrapped, ids, valid)
    as_case = _run(wrapped, ids, valid[:, None, :])
    assert float((select_valid(as_hf, valid) - select_valid(hf, valid)).abs().max()) > 1e-2
    torch.testing.assert_close(select_valid(as_case, valid), select_valid(hf, valid), atol=1e-5, rtol=1e-5)
