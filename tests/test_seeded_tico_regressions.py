"""Regressions of the kinds tico's history shows, put back into a copy of tico 0.3.0, that leave the
tiny outputs within their limits: the matrix must go red on them anyway, naming the change, and
only through the check built for that kind (every other check of the items stays green, which is
why each kind needs its own check). Each kind is seeded at least twice, in different places.

- structure: what tico builds changes (a conversion pass dropped, a requantize) -> circle_structure;
- names and keys: fp_name no longer the float module's path -> name_contract;
- the runtime's call contract: keyword inputs bound wrongly -> circle_call;
- override scope: an override aimed at one module lands on none or on another -> override_scope;
- calibration at the edges: right on dense random inputs, wrong on features calibration never showed ->
  the ``calibration=edge`` variant of the case (cases/_edge_calibration.py), its dense baseline green;
- the wrapper's own call options: a documented option (position ids, another mask form) mishandled in a
  branch the samples never take -> call_contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from harness.records import node_ids
from tests.tico_tree import copy_tico, edit, run_harness


@dataclass(frozen=True)
class Seeded:
    name: str
    kind: str
    edits: tuple[tuple[str, str, str], ...]
    items: tuple[str, ...]  # node ids of (case, profile) groups: every check of each runs
    check: str  # the one check that must go red
    message: str  # a regex the failure must match, naming the change
    # checks that go red too because they read what the change broke (named, never open-ended)
    also_red: tuple[str, ...] = ()
    # groups run beside the seeded ones that must stay green (the same case on dense inputs)
    green: tuple[str, ...] = ()


WRAPPERS = "quantization/wrapq/wrappers"

SEEDED = [
    Seeded(
        # a pass dropped from the conversion pipeline: the broadcasts it removed stay in the graph
        "expand-pass-dropped",
        "structure",
        (("utils/convert.py", "            RemoveRedundantExpand(),\n", ""),),
        (
            "cases/llama.py::llama_attention_prefill[tiny]",
            "cases/gemma4.py::gemma4_vision_attention[tiny]",
            "cases/qwen3_vl.py::qwen3_vl_vision_attention[tiny]",
        ),
        "circle_structure",
        r"Circle structure changed .*: BROADCAST_TO \d+ -> \d+ in Quant\w+Attention",
    ),
    Seeded(
        "linear-input-requantized",
        "structure",
        (
            (
                f"{WRAPPERS}/nn/quant_linear.py",
                "        x_q = self._fq(x, self.obs_act_in)\n",
                "        x_q = self._fq(self._fq(x, self.obs_act_in) * 1.0, self.obs_act_in)\n",
            ),
        ),
        ("cases/nn.py::nn_linear[tiny]", "cases/qwen3_vl.py::qwen3_vl_vision_mlp[tiny]"),
        "circle_structure",
        r"Circle structure changed .*: MUL 0 -> \d+ in QuantLinear",
    ),
    Seeded(
        # tico PR 658: PTQWrapHelper named the root "model", so every name below it had a prefix
        "root-named-model",
        "names",
        (
            (
                "quantization/wrapq/wrap_helper.py",
                "            return PTQWrapper(root, qcfg=qcfg, fp_name=fp_name)\n",
                '            return PTQWrapper(root, qcfg=qcfg, fp_name=fp_name or "model")\n',
            ),
        ),
        ("cases/llama.py::llama_mlp[tiny]", "cases/qwen3_vl.py::qwen3_vl_text_mlp[tiny]"),
        "name_contract",
        r"fp_name 'model\.(gate_proj|up_proj|down_proj)' names no module of the float model",
    ),
    Seeded(
        "decoder-layer-keys-layer-local",
        "names",
        (
            (
                f"{WRAPPERS}/llama/quant_decoder_layer.py",
                'fp_name=join_name(fp_name, "self_attn"),',
                'fp_name="self_attn",',
            ),
        ),
        ("cases/llama_model.py::llama_model[tiny]",),
        "name_contract",
        r"fp_name 'self_attn' names no module of the float model|fp_name 'self_attn\.q_proj' names no module",
    ),
    Seeded(
        "mlp-sibling-name-copied",
        "names",
        (
            (
                f"{WRAPPERS}/llama/quant_mlp.py",
                'mlp_fp.gate_proj, qcfg=gate_cfg, fp_name=join_name(fp_name, "gate_proj")',
                'mlp_fp.gate_proj, qcfg=gate_cfg, fp_name=join_name(fp_name, "up_proj")',
            ),
        ),
        ("cases/llama.py::llama_mlp[tiny]",),
        "name_contract",
        r"fp_name 'up_proj' \(Linear\) but it wraps the float module at 'gate_proj'",
    ),
    Seeded(
        # the causal-LM wrapper stops carrying the float model's quantizers: tico's PTQ stage looks for
        # them on the prepared tree (find_gptq_quantizers) and finds none
        "gptq-quantizers-left-behind",
        "names",
        (
            (
                f"{WRAPPERS}/llama/quant_model_for_causal_lm.py",
                '        self.quantizers = getattr(model_fp, "quantizers", None)\n',
                "",
            ),
        ),
        ("--profile=tiny_nightly", "cases/recipe_runner.py::llama_recipe_gptq_for_causal_lm[tiny_nightly]"),
        "algorithm_handoff",
        r"tico's PTQ stage finds no GPTQ quantizers on the prepared model .* though GPTQ produced 14",
    ),
    Seeded(
        # GPTQ keys each quantizer by the linear's name inside its decoder layer, not by its model path
        "gptq-keys-layer-local",
        "names",
        (
            (
                "quantization/algorithm/gptq/quantizer.py",
                "= module_name[subset[name]]\n\n                    if gptq_conf.verbose:",
                "= name\n\n                    if gptq_conf.verbose:",
            ),
        ),
        ("--profile=tiny_nightly", "cases/recipe_runner.py::llama_recipe_gptq_for_causal_lm[tiny_nightly]"),
        "algorithm_handoff",
        r"7 of 7 GPTQ quantizers match no wrapper's fp_name, so inject_gptq_qparams leaves their grids unused",
        # no quantizer key names a module, so no grid is recorded for the gain to be measured on
        also_red=("algorithm_gain",),
    ),
    Seeded(
        "keywords-bound-in-call-order",
        "call contract",
        (
            (
                "utils/signature.py",
                "        for idx in range(len(args), len(self.names)):\n"
                "            name = self.names[idx]\n"
                "            inputs.append(kwargs[name])\n",
                "        inputs.extend(kwargs.values())\n",
            ),
        ),
        ("cases/llama.py::llama_attention_prefill[tiny]",),
        "circle_call",
        r"call by keyword, order .*: input 0 'hidden_states' was bound to the value given for 'position_embeddings_\d'",
    ),
    Seeded(
        # the user's call hands the runtime the keywords in the order given, past tico's binding: only the
        # path users call shows it (the binding itself, which the FAKE_QUANTIZE calls use, is untouched)
        "infer-skips-the-binding",
        "call contract",
        (
            (
                "interpreter/infer.py",
                "    user_inputs = input_spec.bind(args, kwargs, check=True)\n",
                "    user_inputs = [*args, *kwargs.values()]\n",
            ),
        ),
        ("cases/llama.py::llama_attention_prefill[tiny]", "cases/gemma4.py::gemma4_vision_attention[tiny]"),
        "circle_call",
        r"CircleModel\(\.\.\.\) called by keyword, order .*: tico's runtime received other inputs than from the "
        r"positional call",
    ),
    Seeded(
        "tuple-keyword-names-drift",
        "call contract",
        (
            (
                "utils/signature.py",
                'unpack_recursive(f"{name}_{i}", v, store)',
                'unpack_recursive(f"{name}{i}", v, store)',
            ),
        ),
        (
            "cases/llama.py::llama_attention_prefill[tiny]",
            "cases/qwen3_vl_text.py::qwen3_vl_text_attention_prefill[tiny]",
        ),
        "circle_call",
        r"call by keyword, order .*: binding the inputs raised KeyError: 'position_embeddings_0'",
    ),
    Seeded(
        # the decoder layers get the "layers" scope itself, not their index's
        "layer-index-scope-dropped",
        "override scope",
        (
            (
                f"{WRAPPERS}/llama/quant_model.py",
                "child_cfg = layers_cfg.child(child_scope) if layers_cfg is not None else None",
                "child_cfg = layers_cfg",
            ),
        ),
        ("cases/llama_model.py::llama_model[tiny]",),
        "override_scope",
        r"override layers\.1\.self_attn\.q_proj\.weight -> \S+ \(.*\) did not reach it \(still uint8\)",
    ),
    Seeded(
        # every text layer reads layer 0's overrides
        "layers-read-layer-0-scope",
        "override scope",
        (
            (
                f"{WRAPPERS}/gemma4/quant_text_model.py",
                'qcfg=qcfg.child("layers").child(str(i)) if qcfg else None,',
                'qcfg=qcfg.child("layers").child("0") if qcfg else None,',
            ),
        ),
        ("cases/gemma4_text.py::gemma4_text_model[tiny]",),
        "override_scope",
        r"override layers\.1\.self_attn\.q_proj\.weight -> \S+ \(.*\) did not reach it \(still uint8\)",
    ),
    Seeded(
        # dot-path keys kept as literal keys: the config takes them and nothing reads them
        "dot-path-keys-not-expanded",
        "override scope",
        (("quantization/config/ptq.py", 'if isinstance(key, str) and "." in key:', "if False:"),),
        ("cases/llama.py::llama_mlp[tiny]", "cases/qwen3_vl.py::qwen3_vl_vision_block[tiny]"),
        "override_scope",
        r"override \S+ -> \S+ \(dot-path key, QuantSpec leaf\) did not reach it",
    ),
    Seeded(
        # the binding stops checking shapes: an input at another batch than the graph's is computed on
        "bind-skips-shape-check",
        "call contract",
        (("utils/signature.py", "            self.check_shapes(inputs)\n", ""),),
        ("cases/nn.py::nn_linear[tiny]", "cases/cnn.py::tico_concat[tiny]"),
        "circle_call",
        r"input '\w+' in another batch \(torch\.\w+, shape \(\d+, .*\) was bound without complaint",
    ),
    Seeded(
        # the binding stops comparing dtypes: a float input reaches a uint8 input of the graph
        "bind-skips-dtype-check",
        "call contract",
        (("utils/signature.py", "                if inp.dtype != ref_type:\n", "                if False:\n"),),
        ("cases/nn.py::nn_linear[tiny]", "cases/cnn.py::cnn_conv2d[tiny]"),
        "circle_call",
        r"input '\w+' in another dtype \(torch\.float32, .* was bound without complaint",
    ),
    Seeded(
        # GPTQ stops putting the rounded weights of never-active features back: their columns stay zero
        "gptq-dead-columns-left-zero",
        "edge calibration",
        (
            (
                "quantization/algorithm/gptq/gptq.py",
                "        else:\n            if groupsize == -1:  # TODO support groupsize != -1\n",
                "        else:\n            if False:\n",
            ),
        ),
        ("cases/algorithms.py::llama_gptq_mlp_w4a16[tiny,calibration=edge]",),
        "algorithm_gain",
        r"output SQNR gain over wrapq alone \[default\] \(dB\) -\d\.\d+ is below threshold -2\.5",
        also_red=("quant_accuracy",),
        green=("cases/algorithms.py::llama_gptq_mlp_w4a16[tiny]",),
    ),
    Seeded(
        # SmoothQuant's scale floor dropped: a never-active feature's scale is 0 and its norm weight infinite
        "smoothquant-scale-floor-dropped",
        "edge calibration",
        (
            (
                "quantization/algorithm/smoothquant/smooth_quant.py",
                "        (activation_max.pow(alpha) / weight_scales.pow(1 - alpha))\n        .clamp(min=1e-5)\n",
                "        (activation_max.pow(alpha) / weight_scales.pow(1 - alpha))\n",
            ),
        ),
        ("cases/algorithms.py::llama_smoothquant_decoder_layer_prefill[tiny,calibration=edge]",),
        "algorithm_gain",
        r"transformed float module vs original, max \|diff\| / max \|output\| nan exceeds threshold 1e-05",
        # the smoothed model is NaN: every check that reads its output or converts it goes red with it
        also_red=(
            "algorithm_handoff",
            "attribution",
            "calibration_coverage",
            "circle_call",
            "circle_replay",
            "circle_structure",
            "dynamic_vs_export",
            "ptq_overrides",
            "qparam_audit",
            "qparam_consistency",
            "quant_accuracy",
            "torch_export",
        ),
        green=("cases/algorithms.py::llama_smoothquant_decoder_layer_prefill[tiny]",),
    ),
    Seeded(
        # tico fixed QuantLlamaModel's RoPE built from past_seen_tokens, whatever position_ids said, in
        # 0.4.0.dev261026 (finding llama-model-position-ids-ignored); the same slip in the Qwen3-VL text model
        "qwen-text-position-ids-ignored",
        "wrapper call options",
        (
            (
                f"{WRAPPERS}/qwen_vl/quant_text_model.py",
                "        if position_ids is None:\n            if torch.compiler",
                "        if True:\n            if torch.compiler",
            ),
        ),
        ("cases/qwen3_vl_text.py::qwen3_vl_text_model[tiny]",),
        "call_contract",
        r"\[position_ids \(B, S\)\] tensor 0: not close",
    ),
    Seeded(
        # HF's (B, S) padding mask read as (query, key), as QuantLlamaModel reads it (finding
        # llama-model-2d-padding-mask); the same slip in the Gemma4 vision attention's (B, K) branch
        "gemma4-vision-keys-as-queries",
        "wrapper call options",
        (
            (
                f"{WRAPPERS}/gemma4/quant_vision_attention.py",
                "            return mask[:, None, None, :]\n",
                "            return mask[:, None, :, None]\n",
            ),
        ),
        ("cases/gemma4.py::gemma4_vision_attention[tiny]",),
        "call_contract",
        r"\[\(B, K\) keep mask\] tensor 0: not close",
    ),
]


@pytest.mark.parametrize("seeded", SEEDED, ids=lambda s: s.name)
def test_a_seeded_tico_regression_is_red_through_its_own_check(tmp_path, seeded):
    tree = copy_tico(tmp_path, seeded.name)
    for relative, old, new in seeded.edits:
        edit(tree, relative, old, new)
    code, results, output = run_harness(tree, tmp_path, *seeded.items, *seeded.green)
    assert code == 1, output[-3000:]
    failed = [r for r in results["results"] if r["outcome"] in ("failed", "error")]
    assert {r["check"] for r in failed} == {seeded.check, *seeded.also_red}, [
        (r["nodeid"], r["message"][-400:]) for r in failed
    ]
    red_groups = {node_ids.group_of(r["nodeid"]) for r in failed}
    items = {item for item in seeded.items if not item.startswith("--")}
    assert red_groups == items, f"red on {sorted(red_groups)}, seeded for {sorted(items)}"
    for record in failed:
        if record["check"] == seeded.check:
            assert re.search(seeded.message, record["message"]), record["message"][-1500:]


def test_every_kind_is_seeded_at_least_twice_in_more_than_one_place():
    kinds: dict[str, list[Seeded]] = {}
    for seeded in SEEDED:
        kinds.setdefault(seeded.kind, []).append(seeded)
    assert set(kinds) == {
        "structure",
        "names",
        "call contract",
        "override scope",
        "edge calibration",
        "wrapper call options",
    }
    for kind, members in kinds.items():
        assert len(members) >= 2, kind
        assert len({e[0] for s in members for e in s.edits}) >= 2 or len({i for s in members for i in s.items}) >= 2
