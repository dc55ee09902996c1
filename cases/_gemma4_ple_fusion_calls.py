"""The call contract of tico's Gemma4 PLE scale fusion (``fuse_gemma4_ple_embedding_scale`` and its
setting reader), the load step the ``gemma4_ple_scale_fusion`` case runs before wrapq: fusing twice
leaves the float model computing what Hugging Face's does, and each model or setting the fusion's
docstring rules out (a prepared tree, hooks, max_norm, a trainable or non-finite scale, shared or
non-contiguous storage, an FP overflow) is refused with its own error, before anything is mutated."""

from __future__ import annotations

import copy

import torch

from harness import Built, CallProbe

_TABLE = "embed_tokens_per_layer"


def _fusion():
    from tico.quantization.wrapq.wrappers.gemma4 import embedding_scale_fusion

    return embedding_scale_fusion


def _hidden(out) -> list[torch.Tensor]:
    return [out.last_hidden_state]


def fusion_probes(built: Built) -> list[CallProbe]:
    sample = built.inputs.evaluation["default"]

    def fresh(edit=None) -> torch.nn.Module:
        """A private copy of the float model with its PLE table edited by ``edit(model, table)``."""
        model = copy.deepcopy(built.module)
        if edit is not None:
            edit(model, model.get_submodule(_TABLE))
        return model

    def fuse(edit):
        return lambda _wrapper: _fusion().fuse_gemma4_ple_embedding_scale(fresh(edit))

    def fused_twice(_wrapper):
        model = fresh()
        _fusion().fuse_gemma4_ple_embedding_scale(model)
        if _fusion().fuse_gemma4_ple_embedding_scale(model) != ():
            raise AssertionError("the second fusion replaced a table again")
        return sample.call(model)

    def setting(model_args):
        return lambda _wrapper: _fusion().gemma4_ple_scale_fusion_enabled(model_args)

    def replace_table(module):
        return lambda model, table: setattr(model, _TABLE, module(table))

    def alias(model, table):
        model.register_module("alias_of_ple_table", torch.nn.Embedding.from_pretrained(table.weight, freeze=True))
        model.alias_of_ple_table.weight = table.weight

    def overflow(model, table):
        with torch.no_grad():
            table.weight.fill_(torch.finfo(table.weight.dtype).max)

    def set_scale(value):
        def edit(model, table):
            table.embed_scale = value

        return edit

    def scale_param(model, table):
        del table.embed_scale
        table.embed_scale = torch.nn.Parameter(torch.tensor(2.0))

    def non_contiguous(model, table):
        weight = table.weight.detach()
        table.weight = torch.nn.Parameter(weight.t().contiguous().t(), requires_grad=False)

    refused = [
        ("model_args not a mapping", setting(["text"]), "TypeError: model_args must be a mapping"),
        ("model_args.text not a mapping", setting({"text": "on"}), "TypeError: model_args.text must be a mapping"),
        (
            "the setting as a string",
            setting({"text": {"ple_embedding_scale_fusion": "true"}}),
            "TypeError: .*must be a bool",
        ),
        (
            "a prepared wrapper tree",
            lambda wrapper: _fusion().fuse_gemma4_ple_embedding_scale(wrapper),
            "RuntimeError: .*requires a fresh FP model",
        ),
        (
            "not a module",
            lambda _w: _fusion().fuse_gemma4_ple_embedding_scale({"embed_tokens_per_layer": None}),
            "TypeError: Expected a fresh floating-point",
        ),
        (
            "a model without the PLE table",
            lambda _w: _fusion().fuse_gemma4_ple_embedding_scale(torch.nn.Linear(2, 2)),
            "ValueError: No embed_tokens_per_layer",
        ),
        (
            "the table as a plain nn.Embedding",
            fuse(replace_table(lambda t: torch.nn.Embedding(*t.weight.shape))),
            "TypeError: .*expected Gemma4TextScaledWordEmbedding",
        ),
        (
            "the table as a Linear",
            fuse(replace_table(lambda t: torch.nn.Linear(2, 2))),
            "TypeError: .*expected a raw Gemma4 PLE embedding",
        ),
        ("a table with max_norm", fuse(lambda model, table: setattr(table, "max_norm", 1.0)), "ValueError: .*max_norm"),
        (
            "a table with a forward hook",
            fuse(lambda model, table: table.register_forward_hook(lambda *a: None)),
            "ValueError: .*remove embedding/offload hooks",
        ),
        ("a non-scalar embed_scale", fuse(set_scale(torch.ones(2))), "ValueError: .*materialized scalar"),
        ("a trainable embed_scale", fuse(scale_param), "ValueError: .*constant, not trainable"),
        ("a negative embed_scale", fuse(set_scale(torch.tensor(-1.0))), "ValueError: .*finite and positive"),
        ("a non-contiguous table", fuse(non_contiguous), "ValueError: .*contiguous FP table"),
        ("a table whose weight another module shares", fuse(alias), "ValueError: .*shared storage"),
        ("a table the scale overflows", fuse(overflow), "ValueError: .*would contain NaN/Inf"),
    ]
    return [
        CallProbe("fused twice (the second a no-op)", fused_twice, reference=lambda hf: sample.call(hf), pick=_hidden),
        *(CallProbe(label, call, refusal=refusal) for label, call, refusal in refused),
    ]
