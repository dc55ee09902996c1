"""Export stages' mechanics: torch.export, tico's Circle conversion (with the quantized
program captured for the qparam audit), and Circle replay in tico's reference runtime."""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from harness import compat
from harness.circle_cache import CacheEntry, CircleCache, Uncacheable, cache_key
from harness.failure_replay import RecordedFailure, ReplayedFailure, keep, record
from harness.qparam_audit import AuditResult, audit_exported_program
from harness.qparam_consistency import (attribute_observers, observer_fake_quants, overwritten_qparams, recording_biases,
                                        recording_folds, requantized_unapplied)


@dataclass
class CircleArtifact:
    binary: bytes
    audit: AuditResult
    path: str | None = None
    output_scales: list[tuple[float, ...]] = field(default_factory=list)
    input_quantization: list[tuple[tuple[float, ...], tuple[int, ...], str] | None] = field(default_factory=list)
    # "hit", "miss" (converted and stored), "off", or "uncacheable: <why>" (converted).
    cache_status: str = "off"
    cache_key: str | None = None
    notes: list[str] = field(default_factory=list)


def export_program(adapter: torch.nn.Module, args: tuple) -> Any:
    """torch.export exactly as tico.convert does it (strict tracing, no dynamic shapes)."""
    with torch.no_grad():
        return torch.export.export(adapter, args, strict=True)


@contextmanager
def _capture_quantized_program() -> Iterator[dict[str, Any]]:
    """tico runs its quantization passes on a program it creates internally, then calls
    check_missing_qparam on it: intercept that call to audit the very same graph."""
    import tico.utils.convert as convert_module

    captured: dict[str, Any] = {}
    original = convert_module.check_missing_qparam

    def capture(program: Any, **kwargs: Any) -> None:
        captured["program"] = program
        captured["ignored"] = kwargs.get("ignore_targets") or set()

    convert_module.check_missing_qparam = capture
    try:
        yield captured
    finally:
        convert_module.check_missing_qparam = original


@contextmanager
def _deferred_fx_codegen() -> Iterator[None]:
    """Skip the whole-graph code generation tico's passes trigger and never use.

    After its decompositions, tico's passes call ``GraphModule.recompile()`` after every
    change (239 times in one conversion of llama_decoder_layer_decode): Python source generated
    and compiled for the whole graph each time, about 40% of conversion time, though no pass reads that code.
    torch's own ``_LazyGraphModule`` (what inductor uses for the same reason) turns
    ``recompile()`` into a mark and generates the code only when ``code`` or ``forward`` is
    used. The decomposed program's graph module is swapped for a lazy one. The Circle bytes
    and the captured quantized graph are the same (tests/test_deferred_codegen.py compares
    them; benchmarks/export_costs.py does so for every case). The final graph is compiled
    once at the end, so a graph whose code cannot be generated still fails conversion."""
    lazy_api = compat.lazy_graph_module()
    if lazy_api is None:  # another torch: convert as tico does, only slower (compat.problems() says so)
        yield
        return
    _LazyGraphModule, _use_lazy_graph_module = lazy_api
    import tico.utils.convert as convert_module

    original = convert_module.traced_run_decompositions
    decomposed: list[Any] = []

    def decompose_then_defer(program: Any) -> Any:
        program = original(program)
        eager = program.graph_module
        lazy = _LazyGraphModule.from_graphmodule(eager)
        lazy.meta.update(eager.meta)
        compat.replace_program_graph_module(program, lazy)
        decomposed.append(program)
        return program

    convert_module.traced_run_decompositions = decompose_then_defer
    try:
        with _use_lazy_graph_module(True):
            yield
        for program in decomposed:
            _LazyGraphModule.force_recompile(program.graph_module)
    finally:
        convert_module.traced_run_decompositions = original


@contextmanager
def counting_codegens() -> Iterator[list[int]]:
    """Count whole-graph code generations (calls of GraphModule.recompile proper; a lazy
    module's recompile() only marks the graph, and its real one calls this): how the deferral
    is measured (benchmarks/export_costs.py) and tested."""
    original = torch.fx.GraphModule.recompile
    count = [0]

    def counted(self: Any) -> Any:
        count[0] += 1
        return original(self)

    torch.fx.GraphModule.recompile = counted
    try:
        yield count
    finally:
        torch.fx.GraphModule.recompile = original


class _UnsupportedOperatorLog(logging.Handler):
    """Collects the operator names tico's check_unsupported_target logs before it raises."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.operators: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.match(r"NOT SUPPORTED OPERATOR\s*\n\s*\(op\) (\S+)", str(record.msg))
        if match:
            self.operators.append(match.group(1))


@contextmanager
def _naming_unsupported_operators() -> Iterator[None]:
    """tico refuses a graph with an operator it cannot convert with one generic line, "NOT
    SUPPORTED OPERATOR IN GRAPH MODULE", and names the operators only in its log
    (utils/convert.py check_unsupported_target). The same error is raised again, of the same
    type, with those names (and counts) on its first line, so a stage failure (and an
    expectation matching it) says which operator was refused."""
    from tico.utils.errors import NotYetSupportedError

    log = _UnsupportedOperatorLog()
    logger = logging.getLogger("tico.utils.convert")
    logger.addHandler(log)
    try:
        yield
    except NotYetSupportedError as exc:
        if not log.operators:
            raise
        counts = {op: log.operators.count(op) for op in dict.fromkeys(log.operators)}
        named = ", ".join(f"{op} x{n}" for op, n in counts.items())
        raise type(exc)(f"{exc}: {named}") from exc
    finally:
        logger.removeHandler(log)


def _convert(program: Any, defer_codegen: bool = True) -> tuple[bytes, AuditResult]:
    """Convert a private copy (tico's passes mutate the program they are given)."""
    from tico.utils.convert import convert_exported_module_to_circle

    observers = observer_fake_quants(program)
    deferral = _deferred_fx_codegen() if defer_codegen else contextlib.nullcontext()
    with _capture_quantized_program() as captured, recording_folds() as applied, recording_biases() as biases, \
            deferral, torch.no_grad(), _naming_unsupported_operators():
        binary = convert_exported_module_to_circle(copy.deepcopy(program))
    if "program" not in captured:
        return binary, AuditResult()
    audit = audit_exported_program(captured["program"])
    audit.attribution_refused = attribute_observers(applied, observers)
    audit.redundant = [record for record in applied if record["redundant"]]
    applied = [record for record in applied if not record["redundant"]]
    audit.applied = applied
    audit.overwritten, audit.replaced_nodes = overwritten_qparams(applied, captured["program"])
    audit.requantized = requantized_unapplied(applied, captured["program"])
    audit.quantized_biases = biases
    return binary, audit


def convert_to_circle(program: Any, cache: CircleCache | None = None, key: str | None = None,
                      reused_key: str | None = None, stage: str = "circle_convert") -> CircleArtifact:
    """tico's conversion, through the content-addressed cache when one is given.

    ``program`` is the ExportedProgram or a callable that traces it. ``key`` is that program's
    cache key when already computed; ``reused_key`` is the key of a program the export cache
    proved equal to this one, so a hit needs no trace. A miss converts the traced program and
    stores it under the program's own key; a conversion that fails reproducibly is stored as
    that failure and replayed on a hit, as a failure of ``stage`` (harness/failure_replay.py).
    When the conversion code cannot be fingerprinted
    (``CircleCache`` raises ``Uncacheable``), the cache is not used and the status says why."""
    get_program = (lambda: program) if isinstance(program, torch.export.ExportedProgram) else program
    if cache is None:
        return _artifact(*_convert(get_program()), "off", None, [])
    status, entry, notes = "miss", None, []
    try:
        if key or reused_key:
            entry, notes = cache.get(key or reused_key)
            if entry is not None:
                key = key or reused_key
        if entry is None and key is None:
            key = cache_key(get_program())
            if key != reused_key:
                entry, more = cache.get(key)
                notes += more
    except Uncacheable as why:
        status, key = f"uncacheable: {why}", None
    if isinstance(entry, RecordedFailure):
        raise ReplayedFailure(entry, f"the Circle cache entry {key[:12]}")
    if entry is not None:
        return _artifact(entry.binary, entry.audit, "hit", key, notes)
    program = get_program()
    try:
        binary, audit = _convert(program)
    except Exception as exc:  # the same program converted by the same code fails the same way
        keep(cache, key, record(stage, exc))
        raise
    if key is not None:
        try:
            cache.put(key, CacheEntry(binary=binary, audit=audit))
        except Uncacheable as why:
            status = f"uncacheable: {why}"
    return _artifact(binary, audit, status, key, notes)


def _artifact(binary: bytes, audit: AuditResult, status: str, key: str | None, notes: list[str]) -> CircleArtifact:
    """The artifact with what the export checks read from the Circle model itself."""
    from tico.circle.runtime.executor import CircleReferenceRuntime

    artifact = CircleArtifact(binary=binary, audit=audit, cache_status=status, cache_key=key, notes=notes)
    runtime_program = CircleReferenceRuntime(binary).program
    for index in runtime_program.outputs:
        q = runtime_program.tensor(index).quantization
        artifact.output_scales.append(tuple(q.scale) if q is not None else ())
    for index in runtime_program.inputs:
        tensor = runtime_program.tensor(index)
        q = tensor.quantization
        artifact.input_quantization.append(
            (tuple(q.scale), tuple(q.zero_point), str(tensor.dtype)) if tensor.is_quantized_integer and q else None
        )
    return artifact


def replay_circle(artifact: CircleArtifact, args: tuple, mode: str) -> list[np.ndarray]:
    """Run the Circle model on float inputs. 'fake_quantize' takes floats as they are;
    'native' quantizes each quantized input with its serialized qparams first and returns
    outputs dequantized, so both modes compare against the same float reference."""
    from tico.circle.runtime.executor import CircleReferenceRuntime
    from tico.circle.runtime.kernels.base import ExecutionMode

    runtime = CircleReferenceRuntime(artifact.binary)
    # Circle inputs are the flattened tensor leaves, in the order torch.export flattens them.
    leaves, _ = compat.tree_flatten(args)
    arrays = [a.detach().cpu().numpy() for a in leaves if isinstance(a, torch.Tensor)]
    if mode == "fake_quantize":
        return list(runtime.run(arrays, mode=ExecutionMode.FAKE_QUANTIZE).outputs)
    native_inputs = []
    for array, quant in zip(arrays, artifact.input_quantization):
        if quant is None:
            native_inputs.append(array)
            continue
        scale, zero_point, dtype = quant
        info = np.iinfo(np.dtype(dtype))
        q = np.clip(np.round(array / scale[0]) + zero_point[0], info.min, info.max)
        native_inputs.append(q.astype(np.dtype(dtype)))
    outputs = []
    program = runtime.program
    for value, index in zip(runtime.run(native_inputs, mode=ExecutionMode.NATIVE).outputs, program.outputs):
        tensor = program.tensor(index)
        q = tensor.quantization
        if tensor.is_quantized_integer and q is not None:
            value = (value.astype(np.float64) - q.zero_point[0]) * q.scale[0]
        outputs.append(np.asarray(value, dtype=np.float32))
    return outputs
