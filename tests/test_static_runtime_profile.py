"""The static_runtime profile is TICO's: its shapes and its case set are read from tico's own wrapper
smoke at run time (tico/quantization/recipes/debug/wrapper_smoke/cases/{llama,gemma4,qwen3_vl}.py), so a
tico bump that moves them fails here, and the builders are checked to feed those shapes."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from cases import _static_runtime as static
from harness.model.case_loading import load_cases

_SMOKE = "tico.quantization.recipes.debug.wrapper_smoke.cases."
# family -> (tico smoke module, its case tuple, its static-runtime shape dataclass, the harness's copy)
_FAMILIES = {
    "llama": ("llama", "LLAMA_CASES", "LlamaStaticRuntimeShape", static.LLAMA),
    "gemma4": ("gemma4", "GEMMA4_CASES", "Gemma4StaticRuntimeShape", static.GEMMA4),
    "qwen3_vl": ("qwen3_vl", "QWEN3_VL_CASES", "Qwen3VLStaticRuntimeShape", static.QWEN3_VL),
}
# The harness's shape names -> the TICO smoke accessors that give that number for one case once its
# profile is validated (each family names its own; the first one a case has is used).
_ACCESSORS = {
    "prefill_seq_len": ("_prefill_seq_len", "_text_prefill_seq_len", "_text_seq_len"),
    "decode_max_seq": ("_decode_max_seq", "_text_seq_len"),
    "vision_patch_seq_len": ("_vision_patch_seq_len",),
    "visual_token_seq_len": ("_visual_token_seq_len",),
    "vision_pool_output_length": ("_vision_pool_output_length",),
    "vision_grid": ("_vision_grid_tuple",),
}
_SENTINEL = {"vision_grid": (-1, -1, -1)}


def _smoke(family: str):
    return importlib.import_module(_SMOKE + _FAMILIES[family][0])


def _static_cfg(family: str) -> dict:
    return {"debug": {"wrapper_smoke": {family: {"size_profile": static.TICO_PROFILES[family]}}}}


def _tico_supported(family: str) -> dict[str, object]:
    """TICO's cases of ``family`` that accept its static-runtime profile (its own validate_config
    decides), validated, by name."""
    supported = {}
    for case in getattr(_smoke(family), _FAMILIES[family][1]):
        try:
            case.validate_config(_static_cfg(family))
        except ValueError:
            continue
        supported[case.name] = case
    return supported


def _harness_static_cases() -> dict[str, object]:
    return {case.name: case for _, case in load_cases() if static.PROFILE in case.profiles}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_family_shapes_are_ticos(family):
    module_name, _, shape_class, ours = _FAMILIES[family]
    shape = getattr(_smoke(family), shape_class)()
    theirs = dataclasses.asdict(shape)
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in theirs.items()} == ours, (
        f"tico's {shape_class} moved: {theirs}; update cases/_static_runtime.py and re-measure the profile"
    )
    # the derived counts the builders use
    if family == "gemma4":
        assert (static.GEMMA4_NUM_PATCHES, static.GEMMA4_VALID_PATCHES) == (shape.num_patches, shape.num_valid_patches)
    if family == "qwen3_vl":
        assert (static.QWEN3_VL_PATCH_TOKENS, static.QWEN3_VL_VISUAL_TOKENS) == (
            shape.num_patch_tokens,
            shape.num_visual_tokens,
        )


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_case_set_is_ticos(family):
    """The cases carrying the profile are exactly TICO's static-runtime set for the family (TICO's
    case names are the harness's)."""
    tico = set(_tico_supported(family))
    assert tico, f"tico defines no {family} case for {static.TICO_PROFILES[family]!r}"
    ours = {name for name, case in _harness_static_cases().items() if case.family == family}
    assert ours == tico, (
        f"harness static_runtime cases differ from tico's set: missing {sorted(tico - ours)}, "
        f"not tico's {sorted(ours - tico)}"
    )


def test_declared_shapes_are_ticos_per_case():
    """Each case's declared static-runtime shapes (``Case.deployment_shapes``) equal what TICO's case
    of that name uses; a case that does not run the profile declares none."""
    declared = {case.name: case.deployment_shapes for _, case in load_cases() if case.deployment_shapes}
    cases = _harness_static_cases()
    assert set(declared) == set(cases), (
        f"shapes declared for {sorted(set(declared) ^ set(cases))} do not match the profile's cases"
    )
    supported = {}
    for family in _FAMILIES:
        supported.update(_tico_supported(family))
    for name, shapes in declared.items():
        tico_case = supported[name]
        for key, value in shapes.items():
            accessor = next((a for a in _ACCESSORS[key] if hasattr(tico_case, a)), None)
            assert accessor is not None, f"{name}: tico's case has none of {_ACCESSORS[key]}"
            theirs = getattr(tico_case, accessor)(_SENTINEL.get(key, -1))
            theirs = tuple(theirs) if isinstance(theirs, (tuple, list)) else int(theirs)
            assert theirs == value, f"{name}: {key} is {value}, tico's {accessor} gives {theirs}"


def _dims(sample) -> set[int]:
    tensors = [v for v in (*sample.args, *sample.kwargs.values()) if isinstance(v, torch.Tensor)]
    tensors += [
        t
        for v in (*sample.args, *sample.kwargs.values())
        if isinstance(v, (tuple, list))
        for t in v
        if isinstance(t, torch.Tensor)
    ]
    dims = {int(d) for t in tensors for d in t.shape}
    dims |= {int(v) for v in (*sample.args, *sample.kwargs.values()) if isinstance(v, int) and not isinstance(v, bool)}
    return dims


def _expected_dim(key: str, value) -> int:
    if key == "vision_grid":
        t, h, w = value
        return t * h * w  # the packed patch rows of one image
    return int(value)


_STATIC_CASE_NAMES = sorted(_harness_static_cases())


_GEMMA4_DECODER_LAYERS = (
    "gemma4_text_decoder_layer_prefill",
    "gemma4_text_decoder_layer_sliding_prefill",
    "gemma4_text_decoder_layer_decode",
    "gemma4_text_decoder_layer_shared_kv",
)


@pytest.mark.parametrize("name", _STATIC_CASE_NAMES)
def test_builders_feed_the_declared_shapes(name):
    """Every sample a case's builder makes at static_runtime carries the declared sizes (the builder
    reads the profile, not only the table). Real builds: each holds one layer at real width. TICO builds
    its e2b_static_runtime Gemma4 decoder layers with PLE on: those builders take the same width, and every
    sample feeds a per_layer_input of it (checked on the same build)."""
    case = _harness_static_cases()[name]
    torch.manual_seed(case.seed)
    built = case.build(static.PROFILE)
    samples = {**{f"calibration[{i}]": s for i, s in enumerate(built.inputs.calibration)}, **built.inputs.evaluation}
    assert case.deployment_shapes, f"{name}: no deployment shape declared"
    for key, value in case.deployment_shapes.items():
        want = _expected_dim(key, value)
        for label, sample in samples.items():
            assert want in _dims(sample), f"{name} {label}: no input of size {want} ({key}={value})"
    if name in _GEMMA4_DECODER_LAYERS:
        tico_case = _tico_supported("gemma4")[name]
        torch.manual_seed(0)
        tico_case.build(_static_cfg("gemma4"))
        width = int(tico_case.text_cfg.hidden_size_per_layer_input)
        assert width == static.GEMMA4_PLE_DIM > 0
        assert built.module.hidden_size_per_layer_input == width
        for sample in samples.values():
            assert sample.kwargs["per_layer_input"].shape == (*sample.kwargs["hidden_states"].shape[:2], width)
