"""The call contract of the Gemma4 assistant's host sparse head (``Gemma4AssistantSparseHead``), the
host half of the deployed assistant: the NPU core hands it the hidden state and centroid logits, and it
picks candidates from the LM-head weight saved by tico's ``export_gemma4_assistant_sparse_head``.

Without quantization it answers as Hugging Face's masked embedder (full logits, next token); quantized,
the artifact the exporter writes, loaded, replays the wrapper's own logits (its fake-quantized tied
LM head). Each malformed head or artifact and an export tico cannot make are refused with their own
errors."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from harness import Built, CallProbe, unwrap


def _modules():
    from tico.quantization.recipes.export import gemma4_assistant as recipe
    from tico.quantization.wrapq.wrappers.gemma4_assistant import sparse_head

    return recipe, sparse_head


def sparse_head_probes(built: Built) -> list[CallProbe]:
    recipe, sparse = _modules()
    text = built.module.config.get_text_config()
    hidden = torch.rand(1, 3, text.hidden_size, generator=torch.Generator().manual_seed(23)) - 0.5

    def float_head(tree, **changes):
        assistant = unwrap(tree)
        embedder = assistant.masked_embedding
        settings = dict(
            lm_head_weight=assistant.lm_head.wrapped.module.weight,
            token_ordering=embedder.token_ordering,
            num_centroids=embedder.num_centroids,
            centroid_top_k=embedder.centroid_top_k,
        )
        return sparse.Gemma4AssistantSparseHead(**{**settings, **changes})

    def centroids(tree):
        return unwrap(tree).masked_embedding.forward_centroid_logits(hidden)

    def exported(tree):
        with tempfile.TemporaryDirectory() as scratch:
            path = recipe.export_gemma4_assistant_sparse_head(unwrap(tree), Path(scratch))
            return torch.load(path, weights_only=True)

    def from_artifact(tree):
        return sparse.Gemma4AssistantSparseHead.from_artifact(exported(tree)).full_logits(hidden, centroids(tree))

    def wrapper_logits(tree):
        assistant = unwrap(tree)
        return assistant.masked_embedding(hidden, assistant._lm_head_weight())

    def hf_logits(hf):
        return hf.masked_embedding(hidden, hf.lm_head.weight)

    def without_masked_embedding(tree):
        unwrap(tree).masked_embedding = None
        return exported(tree)

    def select(hidden_states=hidden, num_centroids=None):
        def call(tree):
            head = float_head(tree)
            return sparse.select_sparse_candidates(
                hidden_states,
                head.lm_head_weight,
                centroid_logits=centroids(tree),
                token_ordering=head.token_ordering,
                num_centroids=num_centroids or head.num_centroids,
                centroid_top_k=head.centroid_top_k,
            )

        return call

    weight = built.module.lm_head.weight.detach()
    refused = [
        (
            "both a float and an integer weight",
            lambda m: float_head(m, lm_head_weight_int=weight.to(torch.uint8)),
            "ValueError: Cannot specify both",
            "noquant",
        ),
        (
            "no weight at all",
            lambda m: float_head(m, lm_head_weight=None),
            "ValueError: Must specify either",
            "noquant",
        ),
        (
            "an integer weight without its qparams",
            lambda m: float_head(m, lm_head_weight=None, lm_head_weight_int=weight.to(torch.uint8)),
            "ValueError: lm_head_weight_int requires both",
            "noquant",
        ),
        (
            "a rank-3 weight",
            lambda m: float_head(m, lm_head_weight=weight[None]),
            "ValueError: Sparse-head lm_head_weight must be rank 2",
            "noquant",
        ),
        (
            "a token ordering of another vocabulary",
            lambda m: float_head(m, token_ordering=torch.arange(3)),
            "ValueError: token_ordering length must match",
            "noquant",
        ),
        (
            "an artifact of another schema",
            lambda m: sparse.Gemma4AssistantSparseHead.from_artifact({**exported(m), "schema_version": 2}),
            "ValueError: Unsupported Gemma4 assistant sparse-head artifact schema",
            "quant",
        ),
        (
            "hidden states without a position axis",
            select(hidden_states=hidden[0]),
            "ValueError: Gemma4 assistant sparse head expects hidden states shaped",
            "noquant",
        ),
        (
            "centroids that do not divide the vocabulary",
            select(num_centroids=text.vocab_size - 1),
            "ValueError: token_ordering length must be divisible",
            "noquant",
        ),
        (
            "an export from an assistant without ordered embeddings",
            without_masked_embedding,
            "ValueError: The assistant does not use ordered embeddings",
            "quant",
        ),
        (
            "an export before conversion",
            exported,
            "RuntimeError: The assistant lm_head weight observer has no qparams",
            "noquant",
        ),
    ]
    return [
        CallProbe(
            "host sparse head on the float weight",
            lambda m: float_head(m).full_logits(hidden, centroids(m)),
            reference=hf_logits,
            pick=lambda out: [out],
        ),
        CallProbe(
            "host sparse head's next token",
            lambda m: float_head(m)(hidden, centroids(m)).float(),
            reference=lambda hf: hf_logits(hf).argmax(-1).float(),
            pick=lambda out: [out],
        ),
        CallProbe(
            "the exported sparse-head artifact replays the wrapper's logits",
            from_artifact,
            twin=wrapper_logits,
            pick=lambda out: [out],
            mode="quant",
        ),
        *(CallProbe(label, call, refusal=refusal, mode=mode) for label, call, refusal, mode in refused),
    ]
