"""tico's conversion options (``tico.convert(..., config=...)``, its ``CompileConfigV1``), each on a case it acts on.

One entry per (case, options): the case converted with those options set, its Circle judged by the checks that
read the conversion. Every other check of the case is its own case's item: the options change what tico converts,
nothing before it. An option is listed where it changed the case's Circle binary on the pinned tico (measured by
converting the case's exported program with each option flipped, docs/conversion-options.md); the options that
changed no case's binary are in ``ACTS_ON_NO_CASE`` with why.
"""

from __future__ import annotations

import dataclasses

from cases import gemma4_text_attention, llama, qwen3_vl_text
from harness import Case

# The checks that read the Circle model or its conversion; the others judge what the options do not reach.
CONVERSION_CHECKS = ("circle_structure", "circle_replay", "circle_call", "qparam_audit", "qparam_consistency")

# (case, entry name, options, what the options change in that case's conversion)
ENTRIES = (
    (
        "llama_attention_prefill",
        "expand_to_slice_cat",
        {"convert_expand_to_slice_cat": True},
        "ConvertExpandToSliceCat rewrites the K/V expand of grouped-query attention into slices and a concat",
    ),
    (
        "llama_attention_prefill",
        "fx_passes",
        {"circle_optimize": False},
        "circle_optimize=False: the Circle model as serialized, without tico's post-serialization O1 optimization",
    ),
    (
        "qwen3_vl_text_attention_prefill",
        "fx_passes",
        {"circle_optimize": False},
        "circle_optimize=False on Qwen3-VL's text attention (its rotary and QK-norm graph)",
    ),
    (
        "gemma4_text_attention_prefill",
        "fx_passes",
        {"circle_optimize": False},
        "circle_optimize=False on Gemma4's text attention (its sliding-window mask graph)",
    ),
)

# Options that changed no case's Circle binary on the pinned tico, and why none can act here.
ACTS_ON_NO_CASE = {
    "legalize_causal_mask_value": "rewrites a causal mask's fill constant in the graph; every case's mask is an "
    "input or folded before conversion, so no constant mask reaches the pass",
    "remove_constant_input": "drops graph inputs that are constants; no case exports a constant input",
    "convert_lhs_const_mm_to_fc": "needs an aten.mm with a constant left operand; the wrappers lower to linear",
    "convert_rhs_const_mm_to_fc": "on by default; no case exports an aten.mm with a constant right operand, so "
    "turning it off changes nothing",
    "convert_single_batch_lhs_const_bmm_to_fc": "needs a batch-1 aten.bmm with a constant left operand",
    "eliminate_rank_round_trip": "needs a reshape that raises and lowers the rank around elementwise ops; none of "
    "the converted graphs has one",
}


def _non_conversion_checks(case: Case) -> dict[str, str]:
    from harness.checks import all_checks

    why = "the conversion options change only what tico converts: the case without them runs this check"
    return {check.name: why for check in all_checks() if check.name not in CONVERSION_CHECKS}


def _entry(base: Case, name: str, options: dict[str, bool], what: str) -> Case:
    frozen = dict(options)
    return dataclasses.replace(
        base,
        name=f"{base.name}_{name}",
        description=f"{base.name} converted with {', '.join(f'{k}={v}' for k, v in frozen.items())}: {what}",
        compile_options=lambda profile: frozen,
        profiles=("tiny",),
        golden_profiles=(),
        structure_profiles=("tiny",),
        not_applicable={**base.not_applicable, **_non_conversion_checks(base)},
        expected_failures={k: v for k, v in base.expected_failures.items() if k in CONVERSION_CHECKS},
        sweep=None,
        profile_limits={},
    )


_BASES = {case.name: case for module in (llama, qwen3_vl_text, gemma4_text_attention) for case in module.CASES}

CASES = [_entry(_BASES[case], name, options, what) for case, name, options, what in ENTRIES]
