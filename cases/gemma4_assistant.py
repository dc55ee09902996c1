"""Gemma4 assistant (MTP draft model): the draft-one core (the ordered sparse LM head is its own case,
``cases/gemma4_assistant_sparse_head.py``).

The assistant drafts one token from the target model's concatenated embedding/hidden state
and the target's shared K/V; it owns no K/V projections and no cache. tico splits it in two:
a static NPU core (pre-projection, shared-KV decoder stack, post-projection, centroid
logits) exported through its fixed-capacity adapter, and the ordered sparse head (top-k
centroids, token-ordering gather, full-vocabulary scatter), which stays on the host and is
never exported. Both are compared with Hugging Face's own modules, on TICO's tiny smoke
config: two shared-KV layers (sliding window 4, then full attention), a 10-token target past.

The core builds its per-layer-type masks (bidirectional, padding, sliding window counted
back from the newest key) and RoPE tables itself on the eager path; both are checked, and a
left-padded target past is evaluated. Hugging Face and tico are imported inside builders.
Checked on transformers 5.22.2 (5.23 is reported to break the assistant core).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from cases._gemma4_assistant_calls import assistant_probes
from cases._gemma4_assistant_common import (
    ASSISTANT_MIN_VERSIONS,
    ASSISTANT_REQUIRES,
    assistant_config,
    random_token_ordering,
)
from cases._shared_diagnoses import MASK_TEMPLATE_PER_LAYER, replaced_qparams
from harness import (
    Built,
    CallContractCapability,
    Case,
    CaseInputs,
    ExportCapability,
    MaskCapability,
    MaskProbe,
    RotaryCapability,
    RotaryTables,
    Sample,
    Sweep,
    expect,
    first_call_kwarg,
    unwrap,
)

KV_LEN = 10  # target past seen by the draft step (TICO's smoke kv_len)
# The target's sliding-window layers hand over only their newest keys. TICO's smoke feeds all
# 10, which its own static canonicalizer refuses for the 8-slot sliding capacity; 8 covers the
# window + 1 = 5 keys the draft query can see, so HF's output is the same.
SLIDING_KV_LEN = 8
FULL_KV_CAPACITY = 16  # static core capacities (TICO's smoke export shape)
SLIDING_KV_CAPACITY = 8
LAYER_TYPES = ("full_attention", "sliding_attention")


# --- core ------------------------------------------------------------------------------------


def _kv_head_dims(text_config) -> dict[str, int]:
    from tico.quantization.wrapq.wrappers.gemma4_assistant.utils import assistant_layer_type_head_dim

    return {t: assistant_layer_type_head_dim(text_config, t) for t in LAYER_TYPES}


@dataclass(frozen=True)
class DraftSample(Sample):
    """A draft step that also carries itself canonicalized to the static core's fixed ABI
    (the adapter's 11 positional tensors), built next to the dynamic inputs."""

    static_args: tuple = ()


def _core_sample(config, rope: str, padding: int = 0) -> DraftSample:
    """One draft step: the concatenated target embedding + hidden state, the position after
    the target past, the target's 2-D padding mask (``padding`` left-padded tokens) and its
    shared K/V per layer type."""
    text = config.get_text_config()
    dims = _kv_head_dims(text)
    lengths = {"full_attention": KV_LEN, "sliding_attention": SLIDING_KV_LEN}
    kv = {
        t: (
            torch.randn(1, text.num_key_value_heads, lengths[t], d),
            torch.randn(1, text.num_key_value_heads, lengths[t], d),
        )
        for t, d in dims.items()
    }
    mask = torch.ones(1, KV_LEN, dtype=torch.long)
    mask[:, :padding] = 0
    kwargs = {
        "inputs_embeds": torch.randn(1, 1, 2 * config.backbone_hidden_size),
        "position_ids": torch.tensor([[KV_LEN - 1]]),
        "attention_mask": mask,
        "shared_kv_states": kv,
        "use_cache": False,
    }
    return DraftSample(kwargs=kwargs, static_args=_static_inputs(kwargs, config, rope).as_tuple())


def build_core(profile: str) -> Built:
    from tico.quantization.config.gemma4_attention import get_gemma4_text_attention_options
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

    config = assistant_config(profile)
    module = Gemma4AssistantForCausalLM(config)
    random_token_ordering(module.masked_embedding)
    # the sine convention the wrapper's attention consumes under this case's PTQ config
    rope = get_gemma4_text_attention_options(_core_ptq_config(profile)).rope
    calibration = tuple(_core_sample(config, rope) for _ in range(4))  # unpadded, as TICO calibrates
    evaluation = {"default": _core_sample(config, rope), "padded": _core_sample(config, rope, padding=3)}
    return Built(module, CaseInputs(calibration=calibration, evaluation=evaluation), facts={"config": config})


def _core_ptq_config(profile: str, lm_head: str = "uint8"):
    """tico's assistant recipe (int16 activations, uint8 weights) for the 2 layers; ``lm_head`` (a sweep
    axis) "int8_symm" passes the builder's ``lm_head_weight`` option a signed per-channel symmetric spec."""
    from tico.quantization.config.gemma4_assistant_builders import build_gemma4_assistant_ptq_config
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT8
    from tico.quantization.wrapq.qscheme import QScheme

    if lm_head not in ("uint8", "int8_symm"):
        raise ValueError(f"unknown lm_head weight spec {lm_head!r}")
    spec = affine(INT8, qscheme=QScheme.PER_CHANNEL_SYMM) if lm_head == "int8_symm" else None
    return build_gemma4_assistant_ptq_config(num_hidden_layers=2, lm_head_weight=spec)


def _static_inputs(kwargs, config, rope: str):
    """Dynamic draft inputs canonicalized by tico's host helper to the core's fixed ABI
    (capacity-padded K/V, additive masks, RoPE from an HF rotary module in ``rope``'s sine
    convention)."""
    from tico.quantization.wrapq.wrappers.gemma4_assistant.static_inputs import (
        Gemma4AssistantStaticShapeConfig,
        canonicalize_gemma4_assistant_static_inputs,
    )
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    return canonicalize_gemma4_assistant_static_inputs(
        inputs_embeds=kwargs["inputs_embeds"],
        position_ids=kwargs["position_ids"],
        attention_mask=kwargs["attention_mask"],
        shared_kv_states=kwargs["shared_kv_states"],
        shape=Gemma4AssistantStaticShapeConfig(full_kv_length=FULL_KV_CAPACITY, sliding_kv_length=SLIDING_KV_CAPACITY),
        model_or_config=config,
        rotary_emb=Gemma4TextRotaryEmbedding(config.get_text_config()),
        rope=rope,
    )


def _core_adapter(root: torch.nn.Module, sample: Sample, built: Built) -> torch.nn.Module:
    """tico's static draft-one core adapter. It refuses anything but QUANT unless asked for a
    float reference export, which the NO_QUANT leg of dynamic_vs_export needs."""
    from tico.quantization.wrapq.wrappers.gemma4_assistant.export_adapters import Gemma4AssistantCoreExportAdapter

    return Gemma4AssistantCoreExportAdapter(root, allow_float=True)


def _layers(root: torch.nn.Module):
    """(layer_type, decoder-layer wrapper) for the assistant's layers, in order."""
    assistant = unwrap(root)
    return [(assistant.model.config.layer_types[i], layer) for i, layer in enumerate(assistant.model.layers)]


def _hf_rope(config, position: int, layer_type: str, convention: str) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's rotary module at one position, with sine put into the wrapper's convention."""
    from tico.quantization.wrapq.wrappers.gemma4.rope import prepare_gemma4_rope_sin
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    rotary = Gemma4TextRotaryEmbedding(config.get_text_config())
    cos, sin = rotary(torch.zeros(1), torch.tensor([[position]]), layer_type)
    return cos, prepare_gemma4_rope_sin(sin, convention)


def _static_named(sample: DraftSample) -> dict[str, torch.Tensor]:
    """The sample's exported ABI tensors by tico's input names."""
    from tico.quantization.wrapq.wrappers.gemma4_assistant.static_inputs import GEMMA4_ASSISTANT_CORE_INPUT_NAMES

    return dict(zip(GEMMA4_ASSISTANT_CORE_INPUT_NAMES, sample.static_args))


def _core_rotary(wrapped: torch.nn.Module, reference: torch.nn.Module, built: Built) -> list[RotaryTables]:
    """The eager path builds per-layer-type RoPE at position_ids; the exported core is fed the
    tables tico's host canonicalizer built. Both must equal a fresh HF rotary module's tables at
    the draft position (sine in the wrapper's convention), the right type reaching each layer."""
    config = built.facts["config"]
    convention = unwrap(wrapped).model.rope_convention
    tables = []
    for label in ("default", "padded"):
        sample = built.inputs.evaluation[label]
        position = int(sample.kwargs["position_ids"].reshape(-1)[0])
        static = _static_named(sample)
        for layer_type in LAYER_TYPES:
            prefix = layer_type.split("_")[0]
            tables.append(
                RotaryTables(
                    f"{label}.static.{layer_type}",
                    (static[f"{prefix}_cos"], static[f"{prefix}_sin"]),
                    _hf_rope(config, position, layer_type, convention),
                )
            )
        for i, (layer_type, layer) in enumerate(_layers(wrapped)):
            used = first_call_kwarg(wrapped, layer, lambda m: sample.call(m), "position_embeddings")
            tables.append(
                RotaryTables(
                    f"{label}.layer{i}.{layer_type}", tuple(used), _hf_rope(config, position, layer_type, convention)
                )
            )
    return tables


def _contradicting(sample: DraftSample, built: Built) -> tuple:
    """A full-attention mask one slot short of the 16-slot K/V capacity. (The reverse, K/V
    shorter than the mask, is accepted: tico's Gemma4 attention slices longer masks by design.)"""
    static = _static_named(sample)
    static["full_attention_mask"] = static["full_attention_mask"][..., 1:]
    return tuple(static.values())


def _allowed_keys(valid: torch.Tensor, layer_type: str, window: int) -> torch.Tensor:
    """(1, 1, K) truth for the draft query: full attention sees every valid target key;
    sliding attention holds the newest SLIDING_KV_LEN keys and sees the valid ones among the
    newest ``window + 1``."""
    if layer_type == "full_attention":
        return valid[:, None, :].clone()
    allowed = valid[:, -SLIDING_KV_LEN:].clone()
    allowed[..., : max(0, SLIDING_KV_LEN - (window + 1))] = False
    return allowed[:, None, :]


def _core_masks(root: torch.nn.Module, built: Built) -> list[MaskProbe]:
    """The additive mask each layer's attention applies (after its mask observer), built by
    the wrapper from the 2-D padding mask, unpadded and with 3 left-padded target tokens."""
    window = int(built.facts["config"].get_text_config().sliding_window)
    assistant = unwrap(root)
    fill = float(assistant.qcfg.attention_mask_fill_value)
    probes = []
    for label in ("default", "padded"):
        sample = built.inputs.evaluation[label]
        valid = sample.kwargs["attention_mask"].to(torch.bool)
        for i, (layer_type, layer) in enumerate(_layers(root)):
            fed = first_call_kwarg(root, layer, lambda m: sample.call(m), "attention_mask")
            attn = unwrap(unwrap(layer).self_attn)
            applied = attn._fq(fed, attn.obs_attn_mask)
            probes.append(
                MaskProbe(
                    f"{label}.layer{i}.{layer_type}",
                    applied,
                    torch.ones(1, 1, dtype=torch.bool),
                    fill,
                    allowed=_allowed_keys(valid, layer_type, window),
                )
            )
    return probes


_SHARED_KV = (
    "assistant layers are shared-KV consumers: they take the target's already projected and rotated "
    "K/V, so the key-projection, key-RoPE and new-K/V observers are never used (the attention wrapper "
    "itself leaves them out of its observer list when is_kv_shared_layer)"
)
_NO_NEGATION = "the default profile's pre-negated sine needs no rotate-half negation; q_neg serves rope='hf' only"
_UNIT_SCALING = "Gemma4 attention scaling is 1.0 (q/k norms), so the logit-scale observer is skipped by design"
_TIED_HEAD = (
    "with ordered embeddings the core never calls lm_head; its (fake-quantized) weight only feeds the "
    "sparse head, so lm_head's activation observers are never fed"
)
_MASK_NEVER_SEES_FILL = expect(
    "mask-fill-clamped-by-observer", check="mask_quant", probes=("padded.layer1.full_attention",)
)
_CAPACITY_SLOTS_LEAK = expect("mask-fill-clamped-by-observer", check="dynamic_vs_export", probes=("default", "padded"))

# The tied LM head's weight spec (build_gemma4_assistant_ptq_config's lm_head_weight): the sparse-head
# artifact tico exports stores its integers, so a signed spec reaches code the default uint8 never does.
_LM_HEAD_SWEEP = Sweep(
    axes={"lm_head": ("uint8", "int8_symm")},
    why={"lm_head": "lm_head_weight=affine(INT8, PER_CHANNEL_SYMM): the exported sparse-head artifact's integer table"},
    pr=(),
    overrides={
        "lm_head=int8_symm": {
            "expected_failures": {"call_contract": expect("gemma4-assistant-sparse-head-signed-weight")},
        }
    },
)

CASES = [
    Case(
        name="gemma4_assistant_core",
        family="gemma4_assistant",
        build=build_core,
        seed=2026,
        requires=ASSISTANT_REQUIRES,
        min_versions=ASSISTANT_MIN_VERSIONS,
        ptq_config=_core_ptq_config,
        sweep=_LM_HEAD_SWEEP,
        expected_wrapper="QuantGemma4AssistantForCausalLM",
        # Limits: the measured figures with margin; the aligned copy computes FULLY_CONNECTED as Circle does,
        # so circle_replay is the one-flip floor (docs/case-measurements.md#gemma4_assistant_core)
        settings={
            "quant_accuracy": {"max_mean_abs_diff": 0.011, "max_abs_diff": 0.026, "max_peir": 0.055},
            "circle_replay": {"max_steps": 1.0, "mean_steps": 0.1},
        },
        export=ExportCapability(
            adapter=_core_adapter,
            args=lambda s: s.static_args,
            samples=("default", "padded"),
            contradicting_args=_contradicting,
        ),
        rotary=RotaryCapability(tables=_core_rotary),
        mask=MaskCapability(probes=_core_masks),
        calls=CallContractCapability(
            probes=functools.partial(
                assistant_probes,
                full_capacity=FULL_KV_CAPACITY,
                sliding_capacity=SLIDING_KV_CAPACITY,
                ptq_config=_core_ptq_config,
            )
        ),
        unused_observers={
            **{
                f"model.layers.*.wrapped.self_attn.wrapped.obs_{n}": _SHARED_KV
                for n in ("k_x1", "k_x2", "k_neg", "k_cat", "k_cos", "k_sin", "k_rot", "new_k", "new_v")
            },
            "model.layers.*.wrapped.self_attn.wrapped.obs_q_neg": _NO_NEGATION,
            "model.layers.*.wrapped.self_attn.wrapped.obs_scale": _UNIT_SCALING,
            "lm_head.wrapped.obs_act_in": _TIED_HEAD,
            "lm_head.wrapped.obs_act_out": _TIED_HEAD,
        },
        expected_failures={
            "mask_quant": _MASK_NEVER_SEES_FILL,
            "dynamic_vs_export": _CAPACITY_SLOTS_LEAK,
            "no_side_effects": MASK_TEMPLATE_PER_LAYER,
            "qparam_consistency": replaced_qparams(),
        },
    ),
]
