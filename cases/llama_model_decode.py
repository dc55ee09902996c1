"""``llama_for_causal_lm_decode``: the tiny causal LM decoding with a cache, as tico's recipe
calibrates it and as it deploys.

Calibration and the default evaluation run what tico's Llama recipe adapter runs with
``decode_calibration_steps`` (recipes/adapters/llama.py, ``calibrate_prepared_model``): a prefill with
``use_cache=True``, then one token at a time with the past the model returned, no mask. Decode is
teacher-forced (each step feeds the sample's next token, not the model's argmax), so the float and
quantized models see the same tokens and their logits compare position by position: the output is the
logits after the prompt's last token and after each decoded one.

Export is the deployment's decode step, ``as_export_module('decode')``: one token and the past as
(K, V) tuples per layer in, the logits and the new K/V (``cache_output_mode='delta'``) out. Its sample's
past is the float model's own prefill of the window's first tokens; the reference is the float model
on the whole window without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cases import llama, llama_model
from cases._tico_api import prepared_for_export
from harness import Built, Case, CaseInputs, ExportCapability, Sample, expect, unwrap

WINDOW = llama_model.WINDOW
DECODE_STEPS = 3
PROMPT = WINDOW - DECODE_STEPS
BATCH = 2


def teacher_forced_decode(module: torch.nn.Module, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Prefill ``ids[:, :prompt]`` with a cache, then feed the remaining ids one at a time with the
    returned past (tico's recipe's decode calibration call); (B, S - prompt + 1, V) logits."""
    out = module(input_ids=ids[:, :prompt], use_cache=True, return_dict=True)
    logits = [out.logits[:, -1]]
    for step in range(prompt, ids.shape[1]):
        out = module(
            input_ids=ids[:, step : step + 1], past_key_values=out.past_key_values, use_cache=True, return_dict=True
        )
        logits.append(out.logits[:, -1])
    return torch.stack(logits, dim=1)


@dataclass(frozen=True)
class DecodeSample(Sample):
    """Token ids ``kwargs['input_ids']`` (B, S): the first ``prompt`` prefilled, the rest decoded."""

    prompt: int = PROMPT

    def call(self, module: torch.nn.Module) -> torch.Tensor:
        return teacher_forced_decode(module, self.kwargs["input_ids"], self.prompt)


@dataclass(frozen=True)
class DecodeStepSample(Sample):
    """One decode step as the export adapter takes it: ``input_ids`` (B, 1) and ``past_key_values``, a
    (K, V) tuple per layer computed by the float model from ``seen`` (B, S-1), the tokens before it."""

    seen: torch.Tensor | None = None


def decode_sample(batch: int) -> DecodeSample:
    ids = torch.randint(0, llama_model.VOCAB, (batch, WINDOW))
    return DecodeSample(kwargs={"input_ids": ids}, valid_tokens=torch.ones(batch, DECODE_STEPS + 1, dtype=torch.bool))


def decode_step_sample(model: torch.nn.Module) -> DecodeStepSample:
    """The window's last token after a float prefill of the tokens before it, the past in the layout of
    tico's default (npu_export) attention: K with the attention scale head_dim**-0.5 folded in (its
    k_proj fold), as the wrapper's own prefill caches it (tests/test_llama_decode.py)."""
    ids = torch.randint(0, llama_model.VOCAB, (1, WINDOW))
    with torch.no_grad():
        cache = model(input_ids=ids[:, :-1], use_cache=True, return_dict=True).past_key_values
    fold = model.config.head_dim**-0.5
    past = [(layer.keys * fold, layer.values.clone()) for layer in cache.layers]
    return DecodeStepSample(
        kwargs={"input_ids": ids[:, -1:], "past_key_values": past, "use_cache": True},
        valid_tokens=torch.ones(1, 1, dtype=torch.bool),
        seen=ids[:, :-1],
    )


def build_causal_lm_decode(profile: str) -> Built:
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config = llama_model.model_config(profile)
    module = LlamaForCausalLM(config).eval()
    calibration = tuple(decode_sample(BATCH) for _ in range(4))
    evaluation = {"default": decode_sample(BATCH), "export": decode_step_sample(module)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": config})


def hf_call(reference: torch.nn.Module, sample: Sample):
    """HF decodes as the wrapper does; a decode step is judged against the float model on the whole
    window without a cache (the past it was given is the float model's own)."""
    if isinstance(sample, DecodeStepSample):
        ids = torch.cat([sample.seen, sample.kwargs["input_ids"]], dim=1)
        return reference(input_ids=ids, use_cache=False).logits[:, -1:]
    return sample.call(reference)


def _window(sample: Sample) -> int:
    """The static window a decode step exports at: its past and the new token."""
    return sample.kwargs["past_key_values"][0][0].shape[-2] + sample.kwargs["input_ids"].shape[-1]


decode_export = ExportCapability(
    adapter=lambda root, sample, built: prepared_for_export(unwrap(root).as_export_module("decode"), _window(sample)),
    args=lambda s: (s.kwargs["input_ids"], s.kwargs["past_key_values"]),
    samples=("export",),
    unsupported_mode=lambda root, sample, built: unwrap(root).as_export_module("no_such_mode"),
)

# Eagerly the decode adapter returns the past it was given as the new K/V; traced, the new token's
# (findings/tico.toml; tests/test_llama_decode.py).
DELTA_EAGER_PAST = "llama-decode-delta-eager-returns-past"
FLOAT_CACHE = "llama-model-decode-float-cache"
# The same model as llama_for_causal_lm: its diagnosed expectations hold here too.
_CAUSAL_LM = {case.name: case for case in llama_model.CASES}["llama_for_causal_lm"]
_COVERED_BY_PREFILL = (
    "llama_for_causal_lm checks the model's RoPE tables and masks on prefill; here the decode positions and "
    "the cache are judged through the logits against HF's"
)

CASES = [
    Case(
        name="llama_for_causal_lm_decode",
        family="llama",
        build=build_causal_lm_decode,
        seed=0,
        description=(
            f"LlamaForCausalLM, 2 layers: prefill {PROMPT} tokens with a cache, then {DECODE_STEPS} teacher-forced "
            "decode steps (tico's recipe decode calibration); decode-step export with the past as (K, V) tuples"
        ),
        requires=llama.LLAMA_REQUIRES,
        expected_wrapper="QuantLlamaForCausalLM",
        reference_call=hf_call,
        # Limits: the worst measured sample with margin, the same under native and scalar kernels
        # (docs/case-measurements.md#llama_for_causal_lm_decode)
        settings={
            "quant_accuracy": {
                "max_mean_abs_diff": 0.104,
                "max_abs_diff": 0.468,
                "max_peir": 0.098,
                "min_sqnr_db": 16.4,
            }
        },
        export=decode_export,
        # decode calibration feeds the past and new K/V observers; the key-fold ones stay unused
        unused_observers={
            path: why for path, why in llama_model.UNUSED_OBSERVERS.items() if why is llama_model._KEY_FOLD
        },
        not_applicable={"rotary_parity": _COVERED_BY_PREFILL, "mask_fill": _COVERED_BY_PREFILL},
        expected_failures={
            **_CAUSAL_LM.expected_failures,
            "torch_export": expect(DELTA_EAGER_PAST, check="torch_export"),
            # tico main only (the findings' since): float residual stream, float cache I/O
            "circle_replay": expect(DELTA_EAGER_PAST, FLOAT_CACHE, check="circle_replay"),
            "qparam_audit": expect("llama-decoder-float-residual-stream", FLOAT_CACHE, check="qparam_audit"),
        },
    ),
]
