"""The Circle conversion cache: a hit returns exactly what conversion returns, and the key is
complete -- every change that alters the converted model (a qparam, a weight, an input shape,
a wrapper method patched in place, the tico install) misses."""

from __future__ import annotations

import pytest
import torch

from cases.nn import CASES as NN_CASES
from harness.export import circle_cache
from harness.export.circle_cache import CircleCache, cache_key
from harness.export.stages import convert_to_circle
from harness.pipeline import Pipeline, unwrap

# the caches, their keys and traces are what these tests read: no stage is shared (tests/stage_sharing.py)
pytestmark = pytest.mark.fresh_stages

LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")


def _program(case=LINEAR):
    return Pipeline(case, "tiny").exported_program


def _quantized_root(case=LINEAR):
    pipeline = Pipeline(case, "tiny")
    return pipeline, pipeline.quantized


def test_same_trace_same_key_and_a_hit_is_what_conversion_returns(tmp_path):
    first, second = _program(), _program()
    assert cache_key(first) == cache_key(second)
    cache = CircleCache(tmp_path)
    converted = convert_to_circle(first, cache)
    cached = convert_to_circle(second, cache)
    assert (converted.cache_status, cached.cache_status) == ("miss", "hit")
    assert cached.binary == converted.binary
    assert cached.audit == converted.audit
    assert cached.output_scales == converted.output_scales
    assert cached.input_quantization == converted.input_quantization


def _export(pipeline):
    from harness.export.stages import export_program

    name = pipeline.export_sample_name
    adapter = pipeline.case.export.adapter(pipeline.quantized, pipeline.sample(name), pipeline.built)
    return export_program(adapter, pipeline.case.export.args(pipeline.sample(name)))


def test_one_qparam_changes_the_key():
    pipeline = Pipeline(LINEAR, "tiny")
    base = cache_key(_export(pipeline))
    observer = next(
        o
        for o in unwrap(pipeline.quantized).modules()
        if hasattr(o, "_cached_scale") and getattr(o, "_cached_scale") is not None
    )
    observer._cached_scale.mul_(1.0 + 2**-10)
    assert cache_key(_export(pipeline)) != base


def test_one_weight_element_changes_the_key():
    pipeline = Pipeline(LINEAR, "tiny")
    base = cache_key(_export(pipeline))
    weight = next(p for n, p in unwrap(pipeline.quantized).named_parameters() if n.endswith("weight"))
    weight.data.view(-1)[0] += 1e-3
    assert cache_key(_export(pipeline)) != base


def test_input_shape_changes_the_key():
    from harness.export.stages import export_program

    pipeline = Pipeline(LINEAR, "tiny")
    adapter = pipeline.quantized
    (x,) = pipeline.sample("default").args
    assert cache_key(export_program(adapter, (x,))) != cache_key(export_program(adapter, (x[:1],)))


def test_wrapper_method_patched_in_place_changes_the_key(monkeypatch):
    base = cache_key(_program())
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    original = QuantLinear.forward

    def forward_with_doubled_input(self, x):  # a realistic in-place edit: same signature, new math
        return original(self, x * 2)

    monkeypatch.setattr(QuantLinear, "forward", forward_with_doubled_input)
    assert cache_key(_program()) != base


def test_tico_install_changes_the_key(monkeypatch):
    program = _program()
    base = cache_key(program)
    real = circle_cache.environment_fingerprint()
    monkeypatch.setattr(circle_cache, "environment_fingerprint", lambda: dict(real, tico_source="patched"))
    assert cache_key(program) != base


def test_damaged_entry_is_a_noted_miss_and_is_rewritten(tmp_path):
    program = _program()
    cache = CircleCache(tmp_path)
    good = convert_to_circle(program, cache)
    (binary_path,) = tmp_path.rglob("*.circle")
    binary_path.write_bytes(binary_path.read_bytes()[:-7] + b"garbage")
    again = convert_to_circle(program, cache)
    assert again.cache_status == "miss"
    assert any("unreadable" in note and "sha256" in note for note in again.notes)
    assert again.binary == good.binary
    assert convert_to_circle(program, cache).cache_status == "hit"


def test_unhashable_constant_is_uncacheable_not_guessed(tmp_path, monkeypatch):
    program = _program()

    def refuse(_program):
        raise circle_cache.Uncacheable("constant 'obj' is a ScriptObject, not a tensor")

    monkeypatch.setattr(circle_cache, "program_fingerprint", refuse)
    import harness.export.stages as export

    monkeypatch.setattr(export, "cache_key", lambda p: circle_cache.cache_key(p))
    artifact = convert_to_circle(program, CircleCache(tmp_path))
    assert artifact.cache_status.startswith("uncacheable: constant 'obj'")
    assert not list(tmp_path.rglob("*.circle"))


def test_tensor_bytes_distinguish_dtype_and_value():
    a = torch.tensor([1.0, 2.0])
    assert circle_cache._tensor_bytes(a) != circle_cache._tensor_bytes(torch.tensor([1.0, 2.5]))
    assert circle_cache._describe(a) != circle_cache._describe(a.to(torch.float16))


def test_size_one_strides_do_not_split_the_key_but_real_strides_do():
    """Tracing leaves history-dependent strides on size-1 dims (measured: a decode export after
    another case's export); they do not change the layout, so they must not change the key."""
    a, b = torch.empty_strided((1, 2, 1, 8), (16, 8, 16, 1)), torch.empty_strided((1, 2, 1, 8), (16, 8, 8, 1))
    assert circle_cache._describe(a) == circle_cache._describe(b)
    c, d = torch.empty_strided((2, 4), (4, 1)), torch.empty_strided((2, 4), (1, 2))
    assert circle_cache._describe(c) != circle_cache._describe(d)
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    assert circle_cache._describe(_extract_tensor_metadata(a)) == circle_cache._describe(_extract_tensor_metadata(b))
    assert circle_cache._describe(_extract_tensor_metadata(c)) != circle_cache._describe(_extract_tensor_metadata(d))
