"""PTQ algorithms before wrapq on one layer: GPTQ (and UniversalGPTQ), SmoothQuant and Cross-Layer
Equalization handed to the Llama wrappers; the GPTQ runs and handoffs the whole-model cases
(cases/algorithm_models.py) share.

Each case runs the sequence tico's own recipe and examples run (recipes/stages/gptq.py, ptq.py;
wrapq/examples/quantize_with_gptq.py): the algorithm on the float module through
``tico.quantization.prepare/convert`` with the algorithm's config and the case's calibration
samples, then ``prepare(module, PTQConfig(...))``, the handoff (GPTQ: tico's
``inject_gptq_qparams`` locks GPTQ's scale / zero-point into every weight observer; SmoothQuant:
nothing, its scales are folded into the weights), calibration and ``convert``. Every generic
check runs on the result; ``algorithm_handoff`` proves the wrappers and the Circle model hold
what the algorithm computed and ``algorithm_gain`` measures the algorithm's claim against the
same PTQ flow without it.

On a single layer GPTQ's quantizers are read from the float module GPTQ converted, before PTQ
prepare: tico's ``find_gptq_quantizers`` finds none after prepare there (the layer wrappers keep the
float module's children, not the module that carries ``quantizers``). On a whole model they are
found where tico's recipe finds them (``gptq_model_handoff``, cases/algorithm_models.py).

SmoothQuant runs on the layer held under a parent module, as a model holds it: on the bare
layer tico's ``apply_smoothing`` looks its statistics up as ``name + ".self_attn.q_proj"``
with ``name == ""`` and raises KeyError('.self_attn.q_proj') (smooth_quant.py,
``_apply_if_llama_decoder``; tests/test_algorithm_findings.py).
"""

from __future__ import annotations

import dataclasses

import torch

from cases import llama
from cases._edge_calibration import edge_sweep, with_edge_calibration
from harness import (
    AlgorithmCapability,
    AlgorithmRecord,
    Built,
    CaseInputs,
    Sample,
    WeightGrid,
    capture_linear_inputs,
    expect,
    gptq_quantizers_on_prepared,
    inject_gptq_with_key_table,
    merged_settings,
)

_BASE = {case.name: case for case in llama.CASES}


# --- GPTQ -------------------------------------------------------------------------------------


def gptq_run(config: str = "GPTQConfig", **gptq_options):
    """A GPTQ variant (``config``: its config class in tico.quantization.config) through tico's
    public prepare/convert, recording its grids and output weights."""

    def run(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
        import importlib

        from tico.quantization import convert, prepare

        config_module = {
            "GPTQConfig": "gptq",
            "UniversalGPTQConfig": "gptq",
            "FPIGPTQConfig": "fpi_gptq",
            "Qwen3VLGPTQConfig": "qwen3_vl_gptq",
            "Gemma4GPTQConfig": "gemma4_gptq",
        }[config]
        config_cls = getattr(importlib.import_module(f"tico.quantization.config.{config_module}"), config)

        record = gptq_record(module, calibration, call)
        prepared = prepare(module, config_cls(show_progress=False, **gptq_options), inplace=True)
        for sample in calibration:
            call(prepared, sample)
        convert(prepared, inplace=True)
        record_gptq_grids(module, record, config)
        record.facts["gptq_config"] = {"class": config, **gptq_options}
        return record

    return run


def gptq_record(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
    """A GPTQ record's inputs, taken before GPTQ changes the weights: the original weights and the
    float input each linear sees (what ``algorithm_gain`` measures GPTQ's reconstruction on)."""
    linears = {name: m for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    return AlgorithmRecord(
        original_weights={name: m.weight.detach().clone() for name, m in linears.items()},
        # On one layer tico's GPTQ hooks every linear in one pass over the float layer, so each
        # linear's calibration input is the float one captured here. On a whole model
        # (Qwen3VLGPTQ) a later layer's GPTQ reads the quantized outputs of the layers before
        # it: algorithm_gain then measures it on the float inputs, a nearby objective.
        layer_inputs=capture_linear_inputs(module, calibration, call),
    )


def record_gptq_grids(module: torch.nn.Module, record: AlgorithmRecord, label: str) -> None:
    """The grid and output weight of every linear GPTQ quantized (``module.quantizers``, by module name).
    A key that names no module of the float model is kept in the facts: the handoff's key table
    (``algorithm_handoff``) names it, while every other check still runs."""
    modules = dict(module.named_modules())
    for name, quantizer in module.quantizers.items():
        if name not in modules:
            record.facts.setdefault("gptq_keys_naming_no_module", []).append(f"{label}: {name}")
            continue
        record.grids[name] = WeightGrid(
            scale=quantizer.scale.detach().reshape(-1).clone(),
            zero_point=quantizer.zero.detach().reshape(-1).clone(),
            qmax=int(quantizer.maxq),
        )
        record.weights[name] = modules[name].weight.detach().clone()


def gptq_handoff(prepared: torch.nn.Module, module: torch.nn.Module, record: AlgorithmRecord) -> None:
    """tico's GPTQ -> PTQ handoff on one layer, as its layer examples run it: the float module's
    quantizers (a layer wrapper does not carry them, so find_gptq_quantizers finds none after prepare)."""
    inject_gptq_with_key_table(prepared, module.quantizers, "the float module", record.facts)


def gptq_model_handoff(prepared: torch.nn.Module, module: torch.nn.Module, record: AlgorithmRecord) -> None:
    """tico's GPTQ -> PTQ handoff on a whole model, as its recipe's PTQ stage runs it: the quantizers
    where ``find_gptq_quantizers`` finds them on the prepared tree."""
    quantizers, owner = gptq_quantizers_on_prepared(prepared)
    inject_gptq_with_key_table(prepared, quantizers, owner, record.facts)


def _w4a16_config(profile: str):
    """GPTQ's usual deployment: 4-bit weights on GPTQ's unsigned per-channel grid, int16 activations."""
    from tico.quantization.config.ptq import PTQConfig
    from tico.quantization.config.specs import affine
    from tico.quantization.wrapq.dtypes import INT16, UINT4
    from tico.quantization.wrapq.qscheme import QScheme

    return PTQConfig(
        activation=affine(INT16, qscheme=QScheme.PER_TENSOR_SYMM),
        weight=affine(UINT4, qscheme=QScheme.PER_CHANNEL_ASYMM),
    )


MLP_CALIBRATION = 64


def build_mlp_anisotropic(profile: str) -> Built:
    """A Llama MLP fed hidden states with unequal channel scales, as a norm's gains make them
    (GPTQ has nothing to exploit on isotropic inputs: its Hessian is then a multiple of the
    identity and its rounding is round-to-nearest's). 64 calibration samples (640 tokens, 20x the
    widest linear input): with 4 (40 tokens) GPTQ fits the calibration inputs and loses on new
    ones (tests/test_algorithm_findings.py)."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = llama.llama_config(profile)
    module = LlamaMLP(config)
    gains = torch.rand(config.hidden_size) * 3 + 0.1
    sample = lambda batch: Sample(args=(torch.randn(batch, 5, config.hidden_size) * gains,))  # noqa: E731
    calibration = tuple(sample(2) for _ in range(MLP_CALIBRATION))
    return Built(
        module, CaseInputs(calibration=calibration, evaluation={"default": sample(8)}), facts={"channel_gains": gains}
    )


GPTQ_W4 = AlgorithmCapability(
    name="gptq",
    run=gptq_run(weight_bits=4),
    handoff=gptq_handoff,
    claims=("layer_reconstruction", "output_sqnr"),
    description="GPTQ 4-bit per-channel asymmetric weights (actorder, percdamp 0.01), then wrapq W4A16",
)
GPTQ_W8 = AlgorithmCapability(
    name="gptq",
    run=gptq_run(),
    handoff=gptq_handoff,
    claims=("layer_reconstruction",),
    description="GPTQ with tico's default GPTQConfig (8-bit per-channel asymmetric), then wrapq's default PTQConfig",
)


# --- SmoothQuant ------------------------------------------------------------------------------


SMOOTHQUANT_ALPHA = 0.5


class _Model(torch.nn.Module):
    """The decoder layer where a model holds it (``layer``), so tico's SmoothQuant finds it."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer


def _smoothing(amax: torch.Tensor, back: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """SmoothQuant's per-channel scale (Xiao et al. 2023, eq. 4), the harness's own implementation:
    s_j = max|X_j|^alpha / max_k |W_kj|^(1-alpha) over every linear the norm feeds."""
    w_max = torch.stack([w.abs().amax(dim=0) for w in back]).amax(dim=0).clamp(min=1e-5)
    return (amax.pow(alpha) / w_max.pow(1 - alpha)).clamp(min=1e-5)


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def smoothquant_run(alpha: float = SMOOTHQUANT_ALPHA):
    """SmoothQuant through tico's public prepare/convert; the record holds the weights the
    harness expects from the paper's folding, computed independently of tico."""

    def run(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
        from tico.quantization import convert, prepare
        from tico.quantization.config.smoothquant import SmoothQuantConfig

        pairs = {
            "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
        }
        params = dict(module.named_parameters())
        before = {name: p.detach().clone() for name, p in params.items()}
        inputs = capture_linear_inputs(module, calibration, call)
        with torch.no_grad():
            float_before = [_first(call(module, sample)) for sample in calibration]
        record = AlgorithmRecord(
            original_weights={name[: -len(".weight")]: w for name, w in before.items() if name.endswith(".weight")},
            layer_inputs=inputs,
        )
        scales = {}
        for norm, linears in pairs.items():
            s = _smoothing(inputs[linears[0]].abs().amax(dim=0), [before[f"{n}.weight"] for n in linears], alpha)
            scales[norm] = s
            record.weights[norm] = before[f"{norm}.weight"] / s
            for name in linears:
                record.weights[name] = before[f"{name}.weight"] * s.view(1, -1)

        holder = prepare(_Model(module), SmoothQuantConfig(alpha=alpha), inplace=True)
        for sample in calibration:
            call(module, sample)
        convert(holder, inplace=True)
        with torch.no_grad():
            float_after = [_first(call(module, sample)) for sample in calibration]
        # smoothing is an identity of the float model
        record.float_max_rel_diff = max(
            float((after - ref).abs().max() / ref.abs().max()) for after, ref in zip(float_after, float_before)
        )
        record.facts.update(
            {
                "alpha": alpha,
                "smoothing_scale_range": {k: [float(v.min()), float(v.max())] for k, v in scales.items()},
            }
        )
        return record

    return run


def build_decoder_layer_outliers(profile: str) -> Built:
    """The Llama decoder layer with a few outlier channels in its norms' gains, as trained LLMs
    have (the activation outliers SmoothQuant migrates into the weights); without them a
    random layer's activations are flat and there is nothing to smooth."""
    built = llama.build_decoder_layer(profile)
    layer = built.module
    hidden = layer.input_layernorm.weight.numel()
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            outliers = torch.randperm(hidden)[:2]
            norm.weight[outliers] = 20.0
    return built


SMOOTHQUANT = AlgorithmCapability(
    name="smoothquant",
    run=smoothquant_run(),
    claims=("float_identity",),
    description=f"SmoothQuant alpha {SMOOTHQUANT_ALPHA} on both norm -> linear pairs, then wrapq's PTQConfig",
)


# --- Cross-Layer Equalization -----------------------------------------------------------------


def _equalizing_scale(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Cross-layer equalization's per-channel scale (Nagel et al. 2019, section 4.1), the harness's own:
    both layers' channel ranges r1 (first's rows) and r2 (second's columns) become sqrt(r1 * r2), so
    the first layer's rows are multiplied by sqrt(r2 / r1) and the second layer's columns divided by it."""
    r1 = first.abs().amax(dim=1)
    r2 = second.abs().amax(dim=0)
    return torch.sqrt(r2 / r1)


def cle_run(pairs: tuple[tuple[str, str], ...] = (("up_proj", "down_proj"),)):
    """CLE through tico's public prepare/convert (data-free: prepare is a no-op, convert rescales);
    the record holds the weights the paper's equalization gives, computed independently of tico."""

    def run(module: torch.nn.Module, calibration: tuple, call) -> AlgorithmRecord:
        from tico.quantization import convert, prepare
        from tico.quantization.config.cle import CLEConfig

        params = dict(module.named_parameters())
        before = {name: p.detach().clone() for name, p in params.items()}
        with torch.no_grad():
            float_before = [_first(call(module, sample)) for sample in calibration]
        record = AlgorithmRecord(
            original_weights={name[: -len(".weight")]: w for name, w in before.items() if name.endswith(".weight")},
            layer_inputs=capture_linear_inputs(module, calibration, call),
        )
        scales = {}
        for first, second in pairs:
            scale = _equalizing_scale(before[f"{first}.weight"], before[f"{second}.weight"])
            scales[f"{first}->{second}"] = scale
            record.weights[first] = before[f"{first}.weight"] * scale.view(-1, 1)
            record.weights[second] = before[f"{second}.weight"] / scale.view(1, -1)
        prepared = prepare(module, CLEConfig(pairs=list(pairs), show_progress=False), inplace=True)
        convert(prepared, inplace=True)
        with torch.no_grad():
            float_after = [_first(call(module, sample)) for sample in calibration]
        record.float_max_rel_diff = max(
            float((after - ref).abs().max() / ref.abs().max()) for after, ref in zip(float_after, float_before)
        )
        record.facts["equalizing_scale_range"] = {k: [float(v.min()), float(v.max())] for k, v in scales.items()}
        return record

    return run


CLE = AlgorithmCapability(
    name="cle",
    run=cle_run(),
    claims=("float_identity",),
    description="Cross-Layer Equalization of up_proj -> down_proj (absmax), then wrapq's PTQConfig",
)


def _npu(sample: Sample) -> Sample:
    """The sample in tico's default (npu_export) RoPE convention: sin's first half negated."""
    hidden, rope = sample.args
    return Sample(args=(hidden, llama.pre_negate_sin(rope)), kwargs=sample.kwargs, valid_tokens=sample.valid_tokens)


def build_attention_npu(profile: str) -> Built:
    """The Llama attention case's module and inputs for tico's default PTQConfig, whose
    npu_export profile folds the attention scale 1/sqrt(head_dim) into k_proj: GPTQ's k_proj
    grid then reaches the wrapper through inject_gptq_qparams' fold multiplier."""
    built = llama.build_attention(profile)
    inputs = built.inputs
    # The npu_export path feeds obs_new_k / obs_new_v only with use_cache=True, and the export adapter returns
    # them: calibrate and evaluate as the deployment runs (docs/case-measurements.md#llama_gptq_attention_prefill_npu)
    with_cache = lambda s: dataclasses.replace(_npu(s), kwargs={**s.kwargs, "use_cache": True})  # noqa: E731
    return Built(
        built.module,
        CaseInputs(
            calibration=tuple(with_cache(s) for s in inputs.calibration),
            evaluation={k: with_cache(v) for k, v in inputs.evaluation.items()},
        ),
    )


def _hf_attention_npu(reference: torch.nn.Module, sample: Sample):
    """HF gets its own RoPE convention back (pre_negate_sin is its own inverse) and a 4-D mask."""
    return llama._hf_with_4d_mask(reference, _npu(sample))


def _default_ptq_config(profile: str):
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig()


# The PR gate runs the cheap cases; a decoder layer's export and Circle conversion cost as much
# as a Llama decoder-layer case, so the second one runs nightly at the same tiny sizes.
NIGHTLY = "tiny_nightly"


def _derived(base: str, name: str, algorithm: AlgorithmCapability, nightly: bool = False, **changes):
    """A Llama case's module, inputs, export and diagnoses, with an algorithm before wrapq."""
    case = _BASE[base]
    # the tiny profile only: the base's nightly static_runtime profile (TICO's deployment shapes) is the
    # wrapper's, not a claim about the algorithm
    changes.setdefault("profiles", ("tiny",))
    changes.setdefault("profile_limits", {p: v for p, v in case.profile_limits.items() if p in changes["profiles"]})
    changes.setdefault("deployment_shapes", {})
    if nightly:
        build = changes.pop("build", case.build)
        changes.update(build=lambda profile: build("tiny"), profiles=(NIGHTLY,), golden_profiles=(NIGHTLY,))
    # The base's configuration sweep (if any) is the base's: this case replaces its builder.
    changes.setdefault("sweep", None)
    return dataclasses.replace(case, name=name, algorithm=algorithm, description=algorithm.description, **changes)


UNIVERSAL_GPTQ_W4 = AlgorithmCapability(
    name="universal_gptq",
    run=gptq_run("UniversalGPTQConfig", weight_bits=4),
    handoff=gptq_handoff,
    claims=("layer_reconstruction", "output_sqnr"),
    description="tico's model-agnostic UniversalGPTQ, 4-bit per-channel asymmetric weights, then wrapq W4A16",
)

# GPTQ on features calibration never showed: its Hessian has nothing for them, so it zeroes their weight
# columns while it runs and tico puts their rounded weights back (gptq.py, the dead columns); it claims no
# gain there (-1.21 dB measured, -4.25 dB without the put-back). Limits: the measured figures with margin.
GPTQ_EDGE = edge_sweep(
    settings={
        "algorithm_gain": {"min_output_gain_db": -2.5},
        "quant_accuracy": {
            "max_mean_abs_diff": 0.062,
            "max_abs_diff": 0.5,
            "max_peir": 0.11,
            "min_sqnr_db": 14.0,
            "samples": {
                "outlier_last_token": {
                    "max_mean_abs_diff": 29.0,
                    "max_abs_diff": 1410.0,
                    "max_peir": 0.3,
                    "min_sqnr_db": 9.5,
                }
            },
        },
    }
)
# SmoothQuant on a feature calibration never showed: findings/tico.toml, tests/test_algorithm_findings.py
SMOOTHQUANT_EDGE = edge_sweep(
    expected_failures={
        check: expect("smoothquant-never-active-feature", check=check) for check in ("quant_accuracy", "attribution")
    }
)

CASES = [
    _derived(
        "llama_mlp",
        "llama_gptq_mlp_w4a16",
        GPTQ_W4,
        build=with_edge_calibration(build_mlp_anisotropic),
        ptq_config=_w4a16_config,
        settings={"algorithm_gain": {"min_output_gain_db": 0.0}},
        sweep=GPTQ_EDGE,
    ),
    _derived(
        "llama_mlp",
        "llama_universal_gptq_mlp_w4a16",
        UNIVERSAL_GPTQ_W4,
        build=build_mlp_anisotropic,
        ptq_config=_w4a16_config,
        settings={"algorithm_gain": {"min_output_gain_db": 0.0}},
    ),
    _derived("llama_mlp", "llama_cle_mlp", CLE, build=build_mlp_anisotropic),
    _derived("llama_decoder_layer_prefill", "llama_gptq_decoder_layer_prefill", GPTQ_W8, nightly=True),
    _derived(
        "llama_attention_prefill",
        "llama_gptq_attention_prefill_npu",
        GPTQ_W8,
        build=build_attention_npu,
        ptq_config=_default_ptq_config,
        reference_call=_hf_attention_npu,
        unused_observers={
            **_BASE["llama_attention_prefill"].unused_observers,
            "obs_scale": llama._KEY_FOLD,
            "obs_logits_raw": llama._KEY_FOLD,
        },
    ),
    # Outlier gains make the layer's outputs and attention logits far larger than the plain layer's, so its
    # accuracy limits are wider than the base's (docs/case-measurements.md#llama_smoothquant_decoder_layer_prefill)
    _derived(
        "llama_decoder_layer_prefill",
        "llama_smoothquant_decoder_layer_prefill",
        SMOOTHQUANT,
        build=with_edge_calibration(build_decoder_layer_outliers),
        sweep=SMOOTHQUANT_EDGE,
        settings=merged_settings(
            _BASE["llama_decoder_layer_prefill"].settings, quant_accuracy={"max_mean_abs_diff": 0.8, "max_peir": 0.2}
        ),
    ),
]
