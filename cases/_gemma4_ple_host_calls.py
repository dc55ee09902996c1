"""The call contract of the Gemma4 PLE export stages (``Gemma4PLEEmbeddingExportAdapter``,
``Gemma4PLEProjectionExportAdapter``) and of the host ``.pt`` artifact that may stand in for the
``ple_embedding`` Circle (``ple_embedding_host``): how tico's ``export_gemma4_per_layer`` splits the
PLE path for deployment, taken on the text model's PLE variant.

Without quantization each stage answers as Hugging Face's ``get_per_layer_inputs`` and
``project_per_layer_inputs``; quantized, the host table (saved, loaded) replays the adapter it was
built from, as its docstring promises bit for bit, and the projection adapter computes what the
wrapper's own ``project_per_layer_inputs`` does. Each malformed artifact, an adapter built on a
model without PLE or in a mode it cannot export, and an artifact taken before conversion are refused
with their own errors."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from harness import Built, CallProbe, unwrap


def _modules():
    from tico.quantization.wrapq.mode import Mode
    from tico.quantization.wrapq.observers.mx import MXObserver
    from tico.quantization.wrapq.wrappers.gemma4 import export_adapters, ple_embedding_host

    return Mode, MXObserver, export_adapters, ple_embedding_host


def _tensor(value) -> list[torch.Tensor]:
    return [torch.as_tensor(value, dtype=torch.float64)]


def ple_stage_probes(built: Built) -> list[CallProbe]:
    """Probes on one prompt (the stages take ``(1, S)`` ids): answers, twins and refusals."""
    Mode, MXObserver, adapters, host = _modules()
    ids = built.inputs.evaluation["default"].kwargs["input_ids"][:1]
    with torch.no_grad():
        embeds = built.module.embed_tokens(ids)

    def embedding(tree, **kwargs):
        return adapters.Gemma4PLEEmbeddingExportAdapter(unwrap(tree), **kwargs)

    def projection(tree, **kwargs):
        return adapters.Gemma4PLEProjectionExportAdapter(unwrap(tree), **kwargs)

    def hf_tokens(hf):
        return hf.get_per_layer_inputs(ids)

    def host_in_memory(tree):
        return host.Gemma4PLEEmbeddingHostTable.from_artifact(host.build_gemma4_ple_embedding_artifact(embedding(tree)))

    def host_from_file(tree):
        with tempfile.TemporaryDirectory() as scratch:
            path = host.save_gemma4_ple_embedding_artifact(embedding(tree), Path(scratch) / "ple_embedding.pt")
            return host.Gemma4PLEEmbeddingHostTable.from_artifact(str(path))(ids)

    def without_embedding_fake_quant(tree):
        unwrap(tree).embed_tokens_per_layer.wrapped.obs_embedding.disable_fake_quant()
        return tree

    def edited_artifact(edit):
        def call(tree):
            artifact = host.build_gemma4_ple_embedding_artifact(embedding(tree))
            edit(artifact)
            return host.Gemma4PLEEmbeddingHostTable(artifact)

        return call

    def adapter_with(attribute, value):
        def call(tree):
            adapter = embedding(tree)
            setattr(adapter, attribute, value)
            return host.build_gemma4_ple_embedding_artifact(adapter)

        return call

    def text_model_with(attribute, value, build=embedding):
        def call(tree):
            setattr(unwrap(tree), attribute, value)
            return build(tree)

        return call

    answers = [
        CallProbe(
            "PLE embedding stage (NO_QUANT)",
            lambda m: embedding(m)(ids),
            reference=lambda hf: hf_tokens(hf),
            pick=lambda out: [out],
        ),
        CallProbe(
            "PLE embedding stage with an explicit mode",
            lambda m: embedding(m, mode=Mode.NO_QUANT)(ids),
            reference=lambda hf: hf_tokens(hf),
            pick=lambda out: [out],
        ),
        CallProbe(
            "PLE host table, float artifact",
            lambda m: host_in_memory(m)(ids),
            reference=lambda hf: hf_tokens(hf),
            pick=lambda out: [out],
        ),
        CallProbe(
            "PLE projection stage (NO_QUANT)",
            lambda m: projection(m)(embeds, embedding(m)(ids)),
            reference=lambda hf: hf.project_per_layer_inputs(embeds, hf_tokens(hf)),
            pick=lambda out: [out],
        ),
        CallProbe(
            "Circle size estimate of the float table",
            lambda m: host.estimate_gemma4_ple_embedding_circle_bytes(embedding(m)),
            reference=lambda hf: (
                hf.embed_tokens_per_layer.weight.numel() * hf.embed_tokens_per_layer.weight.element_size()
            ),
            pick=_tensor,
        ),
        CallProbe(
            "Circle size estimate of the uint8 table",
            lambda m: host.estimate_gemma4_ple_embedding_circle_bytes(embedding(m)),
            reference=lambda hf: hf.embed_tokens_per_layer.weight.numel(),
            pick=_tensor,
            mode="quant",
        ),
        CallProbe(
            "PLE host table saved and loaded replays the QUANT stage",
            host_from_file,
            twin=lambda m: embedding(m)(ids),
            pick=lambda out: [out],
            mode="quant",
        ),
        CallProbe(
            "PLE host table with one observer's fake quant disabled",
            lambda m: host_in_memory(without_embedding_fake_quant(m))(ids),
            twin=lambda m: embedding(without_embedding_fake_quant(m))(ids),
            pick=lambda out: [out],
            mode="quant",
        ),
        CallProbe(
            "PLE projection stage (QUANT) as the wrapper projects",
            lambda m: projection(m)(embeds, embedding(m)(ids)),
            twin=lambda m: unwrap(m).project_per_layer_inputs(embeds, embedding(m)(ids)),
            pick=lambda out: [out],
            mode="quant",
        ),
    ]
    refused = [
        (
            "an artifact of another stage",
            edited_artifact(lambda a: a.update(stage="token_embedding")),
            "ValueError: Expected a 'ple_embedding' artifact",
            "quant",
        ),
        (
            "an artifact of an unknown schema",
            edited_artifact(lambda a: a.update(schema_version=3)),
            "ValueError: Unsupported Gemma4 PLE embedding artifact schema_version",
            "quant",
        ),
        (
            "a fused-schema artifact whose embed_scale is not 1",
            edited_artifact(lambda a: a.update(schema_version=2)),
            "ValueError: Fused PLE embedding artifacts must have embed_scale=1",
            "quant",
        ),
        (
            "a quantized artifact without an observer",
            edited_artifact(lambda a: a["observers"].pop("act_out")),
            "ValueError: Quantized PLE embedding artifact is missing observers",
            "quant",
        ),
        (
            "an artifact of a plain embedding table",
            adapter_with("embed_tokens_per_layer", torch.nn.Embedding(4, 2)),
            "TypeError: Gemma4 PLE embedding artifact requires a QuantGemma4TextScaledWordEmbedding",
            "quant",
        ),
        (
            "an artifact with a non-affine observer",
            adapter_with("per_layer_token_inputs_observer", MXObserver(name="mx")),
            "TypeError: Gemma4 PLE embedding artifact requires an affine observer",
            "quant",
        ),
        (
            "an artifact taken before conversion",
            lambda m: host.build_gemma4_ple_embedding_artifact(embedding(m, mode=Mode.QUANT)),
            "RuntimeError: Gemma4 PLE embedding observer 'weight' has no frozen qparams",
            "noquant",
        ),
        (
            "the embedding stage in CALIB mode",
            lambda m: embedding(m, mode=Mode.CALIB),
            "RuntimeError: Gemma4 PLE embedding export requires NO_QUANT or QUANT mode",
            "noquant",
        ),
        (
            "the embedding stage on a model without a wrapper mode",
            text_model_with("_mode", "quant"),
            "TypeError: Gemma4 PLE export adapters require an explicit ``mode``",
            "noquant",
        ),
        (
            "the embedding stage on a model without the PLE table",
            text_model_with("embed_tokens_per_layer", None),
            "RuntimeError: Gemma4 PLE export requires the text-model attribute 'embed_tokens_per_layer'",
            "noquant",
        ),
        (
            "the embedding stage on a model without PLE",
            text_model_with("hidden_size_per_layer_input", 0),
            "RuntimeError: Gemma4 PLE embedding export requires hidden_size_per_layer_input > 0",
            "noquant",
        ),
        (
            "the projection stage on a model without PLE",
            text_model_with("hidden_size_per_layer_input", 0, projection),
            "RuntimeError: Gemma4 PLE projection export requires",
            "noquant",
        ),
    ]
    return answers + [CallProbe(label, call, refusal=refusal, mode=mode) for label, call, refusal, mode in refused]
