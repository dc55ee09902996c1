"""torch.export reuse: a hit gives exactly what tracing gives, without tracing; the execution
key is complete (a qparam, a weight, an input shape, a wrapper method patched on the class or
the instance, a helper or flag the forward reads, the environment each miss); it does not
depend on what ran earlier in the process; a wrapper defect seeded after a warm run is still
caught; a damaged entry is a noted miss."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cases.llama import CASES as LLAMA_CASES
from cases.nn import CASES as NN_CASES
from harness.export import execution_key as execution_key_module
from harness.export import export_reuse
from harness.export.execution_key import execution_key
from harness.export.export_reuse import ExportCache
from harness.pipeline import Pipeline, RunSettings, unwrap

# the caches, their keys and traces are what these tests read: no stage is shared (tests/stage_sharing.py)
pytestmark = pytest.mark.fresh_stages

REPO = Path(__file__).resolve().parents[1]
LINEAR = next(c for c in NN_CASES if c.name == "nn_linear")
LLAMA_DECODE = next(c for c in LLAMA_CASES if c.name == "llama_attention_decode")


def _pipeline(case, tmp_path: Path) -> Pipeline:
    settings = RunSettings(circle_cache_dir=tmp_path / "circle", export_cache_dir=tmp_path / "export")
    return Pipeline(case, "tiny", settings=settings)


def _adapter_and_args(pipeline: Pipeline):
    name = pipeline.export_sample_name
    return pipeline.export_adapter("quant", name), pipeline.case.export.args(pipeline.sample(name))


def test_a_hit_reproduces_the_traced_record_without_tracing(tmp_path):
    for case in (LINEAR, LLAMA_DECODE):
        first = _pipeline(case, tmp_path)
        traced = first.export_record
        assert traced.status == "miss" and "torch_export" in first.timings
        second = _pipeline(case, tmp_path)
        reused = second.export_record
        assert reused.status == "hit"
        assert "torch_export" not in second.timings  # torch.export did not run
        for field in ("output_spec", "graph_nodes", "value_guards", "symbolic_shapes", "circle_key"):
            assert getattr(reused, field) == getattr(traced, field), field
        torch.testing.assert_close(second.exported_program_output(), first.exported_program_output(), rtol=0, atol=0)
        assert (first.circle.cache_status, second.circle.cache_status) == ("miss", "hit")
        assert second.circle.binary == first.circle.binary
        assert "torch_export" not in second.timings  # nor did the Circle lookup need the program


def test_circle_entry_gone_falls_back_to_tracing_and_converting(tmp_path):
    _pipeline(LINEAR, tmp_path).circle
    for entry in (tmp_path / "circle").rglob("*.circle"):
        entry.unlink()
    again = _pipeline(LINEAR, tmp_path)
    assert again.export_record.status == "hit"
    assert again.circle.cache_status == "miss"
    assert "torch_export" in again.timings


def _key(pipeline: Pipeline) -> str:
    return execution_key(*_adapter_and_args(pipeline))


def test_one_qparam_changes_the_key(tmp_path):
    pipeline = Pipeline(LINEAR, "tiny")
    adapter, args = _adapter_and_args(pipeline)
    base = execution_key(adapter, args)
    observer = next(o for o in unwrap(adapter).modules() if getattr(o, "_cached_scale", None) is not None)
    observer._cached_scale.mul_(1.0 + 2**-10)
    assert execution_key(adapter, args) != base


def test_one_weight_element_changes_the_key():
    pipeline = Pipeline(LINEAR, "tiny")
    adapter, args = _adapter_and_args(pipeline)
    base = execution_key(adapter, args)
    weight = next(p for n, p in adapter.named_parameters() if n.endswith("weight"))
    weight.data.view(-1)[0] += 1e-3
    assert execution_key(adapter, args) != base


def test_input_shape_changes_the_key():
    pipeline = Pipeline(LINEAR, "tiny")
    adapter, (x,) = _adapter_and_args(pipeline)
    assert execution_key(adapter, (x,)) != execution_key(adapter, (x[:1],))


def test_wrapper_method_patched_on_the_class_changes_the_key(monkeypatch):
    base = _key(Pipeline(LINEAR, "tiny"))
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    original = QuantLinear.forward

    def forward_with_doubled_input(self, x):  # same signature, new math
        return original(self, x * 2)

    monkeypatch.setattr(QuantLinear, "forward", forward_with_doubled_input)
    assert _key(Pipeline(LINEAR, "tiny")) != base


def test_wrapper_method_patched_on_one_instance_changes_the_key():
    pipeline = Pipeline(LLAMA_DECODE, "tiny")
    adapter, args = _adapter_and_args(pipeline)
    base = execution_key(adapter, args)
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    projection = next(m for m in adapter.modules() if isinstance(m, QuantLinear))
    original = projection.forward
    projection.forward = lambda x: original(x)  # same math; a different function runs
    assert execution_key(adapter, args) != base


# A wrapper-like module reading a module-level flag and helper: both paths compute the same
# numbers with the same dispatched ops, so only the code and globals part of the key sees them.
USE_RESHAPE = True


def flatten_tail(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1) if USE_RESHAPE else x.view(x.shape[0], -1)


class _FlagReader(torch.nn.Module):
    def forward(self, x):
        return flatten_tail(x) * 2


def test_a_flag_or_helper_the_forward_reads_changes_the_key(monkeypatch):
    module, args = _FlagReader(), (torch.randn(2, 3, 4),)
    base = execution_key(module, args)
    monkeypatch.setattr(sys.modules[__name__], "USE_RESHAPE", False)
    flipped = execution_key(module, args)
    assert flipped != base
    monkeypatch.setattr(sys.modules[__name__], "USE_RESHAPE", True)
    assert execution_key(module, args) == base
    monkeypatch.setattr(sys.modules[__name__], "flatten_tail", lambda x: x.flatten(1))
    assert execution_key(module, args) != base


def test_environment_changes_the_key(monkeypatch):
    module, args = _FlagReader(), (torch.randn(2, 3, 4),)
    base = execution_key(module, args)
    real = execution_key_module._environment()
    monkeypatch.setattr(
        execution_key_module, "_environment", lambda: real.replace('"tico_source": "', '"tico_source": "x')
    )
    assert execution_key(module, args) != base


def test_fingerprinting_leaves_a_stateful_adapter_as_it_was():
    """An adapter that updates state when called (observers in CALIB mode) is run on a copy."""

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x + self.calls

    module = Counter()
    key = execution_key(module, (torch.ones(2),))
    assert module.calls.item() == 0
    assert execution_key(module, (torch.ones(2),)) == key


KEY_IN_FRESH_PROCESS = r"""
import sys
sys.path.insert(0, sys.argv[1])
from harness.model.case_loading import load_cases
from harness.pipeline import Pipeline, warm_imports
from harness.export.execution_key import execution_key
warm_imports()
cases = {c.name: c for _, c in load_cases()}
for name in sys.argv[2].split(","):
    p = Pipeline(cases[name], "tiny")
    s = p.export_sample_name
    print(name, execution_key(p.export_adapter("quant", s), p.case.export.args(p.sample(s))))
"""


def test_key_does_not_depend_on_what_ran_before_in_the_process():
    """Measured while building this: a first call in a process runs one-time lazy setup in
    torch, and module-level registries grow; neither may reach the key (every rerun missed)."""
    keys = []
    for order in ("nn_linear,llama_attention_decode,llama_mlp", "llama_mlp,llama_attention_decode,nn_linear"):
        done = subprocess.run(
            [sys.executable, "-c", KEY_IN_FRESH_PROCESS, str(REPO), order],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        keys.append(dict(line.split() for line in done.stdout.splitlines() if line.count(" ") == 1))
    assert len(keys[0]) == 3 and keys[0] == keys[1]


def test_a_defect_seeded_after_a_warm_run_is_traced_and_caught(tmp_path, monkeypatch):
    """The regression gate's promise: a warm cache never hides a wrapper edit. A defect that
    makes the exported program drop the output fake-quant is traced again and diverges."""
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    from harness.checks.torch_export import run as torch_export_check

    assert torch_export_check(_pipeline(LINEAR, tmp_path)).passed
    original = QuantLinear.forward

    def forward_skipping_fq_when_traced(self, x):
        if torch.compiler.is_compiling():  # export-only divergence, invisible in eager
            return torch.nn.functional.linear(x, self.module.weight, self.module.bias)
        return original(self, x)

    monkeypatch.setattr(QuantLinear, "forward", forward_skipping_fq_when_traced)
    pipeline = _pipeline(LINEAR, tmp_path)
    result = torch_export_check(pipeline)
    assert pipeline.export_record.status == "miss"
    assert not result.passed


def test_damaged_entry_is_a_noted_miss_and_is_rewritten(tmp_path):
    _pipeline(LINEAR, tmp_path).export_record
    (tensors,) = (tmp_path / "export").rglob("*.safetensors")
    tensors.write_bytes(tensors.read_bytes()[:-5] + b"junk!")
    again = _pipeline(LINEAR, tmp_path).export_record
    assert again.status == "miss"
    assert any("unreadable" in note and "sha256" in note for note in again.notes)
    assert _pipeline(LINEAR, tmp_path).export_record.status == "hit"


def test_an_adapter_the_key_cannot_describe_is_traced_every_time(tmp_path):
    class TakesAGenerator(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape, generator=self.generator)

    module = TakesAGenerator()
    module.generator = torch.Generator().manual_seed(0)
    try:
        execution_key(module, (torch.ones(2),))
    except export_reuse.Uncacheable as why:
        assert "Generator" in str(why)
    else:
        raise AssertionError("a generator argument was keyed")


def test_store_round_trip_keeps_every_field(tmp_path):
    record = export_reuse.ExportRecord(
        output_leaves=[torch.arange(6.0).reshape(2, 3), 3],
        output_spec="",
        graph_nodes=7,
        value_guards=["g"],
        symbolic_shapes=[],
        circle_key="k",
    )
    record.output_spec = torch.utils._pytree.treespec_dumps(torch.utils._pytree.tree_flatten((torch.ones(1), 3))[1])
    cache = ExportCache(tmp_path)
    cache.put("ab" * 32, record)
    loaded, notes = cache.get("ab" * 32)
    assert notes == [] and loaded is not None
    for field in dataclasses.fields(record):
        if field.name not in ("output_leaves", "status", "notes"):
            assert getattr(loaded, field.name) == getattr(record, field.name)
    torch.testing.assert_close(loaded.output_leaves[0], record.output_leaves[0], rtol=0, atol=0)
    assert loaded.output_leaves[1] == 3


def test_an_active_profiler_is_left_alone_and_the_adapter_traced():
    """cProfile (or a debugger) owns sys.setprofile: fingerprinting would break its data."""
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        execution_key(_FlagReader(), (torch.ones(2, 2),))
    except export_reuse.Uncacheable as why:
        assert "profile hook" in str(why)
    else:
        raise AssertionError("fingerprinted under an active profiler")
    finally:
        profiler.disable()
    assert sys.getprofile() is None
