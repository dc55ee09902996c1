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


def test_caller_position_ids_never_reach_rope_and_hf_tables_given_directly_fix_it():
    """Finding llama-model-position-ids-ignored: with a gap in the positions the wrapper answers as
    for 0..S-1; handed HF's RoPE tables for the same positions (``position_embeddings``) it answers
    as HF, so the tables built from past_seen_tokens are the cause. The tables go in tico's default
    convention (the first half of the sine negated, as its templates hold it)."""
    wrapped, ids, mask, _ = _models(2)
    keys = mask.to(torch.bool)[:, None, :]
    gap = (torch.arange(lm.WINDOW) + 5 * (torch.arange(lm.WINDOW) >= lm.WINDOW // 2))[None].expand(2, -1)
    from transformers.models.llama.modeling_llama import LlamaModel

    torch.manual_seed(0)
    hf_model = LlamaModel(lm.model_config("tiny")).eval()
    valid = mask.to(torch.bool)
    with torch.no_grad():
        hf = hf_model(input_ids=ids, attention_mask=mask, position_ids=gap, use_cache=False).last_hidden_state
        ours = wrapped(input_ids=ids, attention_mask=keys, position_ids=gap, use_cache=False).last_hidden_state
        consecutive = wrapped(input_ids=ids, attention_mask=keys, use_cache=False).last_hidden_state
        tables = lm.llama.pre_negate_sin(hf_model.rotary_emb(hf_model.embed_tokens(ids), gap))
        given = wrapped(input_ids=ids, attention_mask=keys, position_embeddings=tables, use_cache=False)
    assert float((select_valid(ours, valid) - select_valid(hf, valid)).abs().max()) > 1e-2
    torch.testing.assert_close(ours, consecutive)
    torch.testing.assert_close(
        select_valid(given.last_hidden_state, valid), select_valid(hf, valid), atol=1e-5, rtol=1e-5
    )
