"""Export stages' mechanics: torch.export, tico's Circle conversion through the Circle cache
(harness/export/circle_conversion.py converts), and Circle replay in tico's reference runtime."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from harness import compat
from harness.circle.missing_qparams import AuditResult
from harness.export.circle_cache import CacheEntry, CircleCache, cache_key
from harness.export.circle_conversion import convert_with_audit
from harness.export.entry_store import Uncacheable
from harness.export.failure_replay import RecordedFailure, keep, record
from harness.model.case_parts import PreparedExport
from harness.primitives.stage_engine import ReplayedFailure


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


def export_program(adapter: torch.nn.Module, args: tuple, measure_traced_code: bool = False) -> Any:
    """torch.export exactly as tico.convert does it (strict tracing, no dynamic shapes); an adapter tico wants
    prepared (``PreparedExport``) is traced inside its preparation, as tico's export recipes do.
    ``measure_traced_code``: a --tico-coverage run, which runs the adapter as Python first."""
    if measure_traced_code:
        run_traced_code_eagerly(adapter, args)
    if isinstance(adapter, PreparedExport):
        with adapter.prepare(adapter.inner):
            return export_program(adapter.inner, args)
    with torch.no_grad():
        return torch.export.export(adapter, args, strict=True)


def run_traced_code_eagerly(adapter: torch.nn.Module, args: tuple) -> None:
    """The adapter's forward run once as Python, on a private copy: strict torch.export traces it through
    dynamo, which coverage.py does not see, so a measured run credits that code to the export stage this
    way. Its output is not used, the copy keeps any state the call changes away from the adapter, and an
    adapter that only works traced raises here without failing the export (the lines it ran still count)."""
    try:
        with torch.no_grad():
            copy.deepcopy(adapter)(*copy.deepcopy(args))
    except Exception:  # noqa: BLE001 - a measurement aid: the export below is what the checks read
        pass


def convert_to_circle(
    program: Any,
    cache: CircleCache | None = None,
    key: str | None = None,
    reused_key: str | None = None,
    stage: str = "circle_convert",
) -> CircleArtifact:
    """tico's conversion, through the content-addressed cache when one is given.

    ``program`` is the ExportedProgram or a callable that traces it. ``key`` is that program's
    cache key when already computed; ``reused_key`` is the key of a program the export cache
    proved equal to this one, so a hit needs no trace. A miss converts the traced program and
    stores it under the program's own key; a conversion that fails reproducibly is stored as
    that failure and replayed on a hit, as a failure of ``stage`` (harness/export/failure_replay.py).
    When the conversion code cannot be fingerprinted
    (``CircleCache`` raises ``Uncacheable``), the cache is not used and the status says why."""
    get_program = (lambda: program) if isinstance(program, torch.export.ExportedProgram) else program
    if cache is None:
        return _artifact(*convert_with_audit(get_program()), "off", None, [])
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
        binary, audit = convert_with_audit(program)
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


def quantized_inputs(artifact: CircleArtifact, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Float inputs as a NATIVE caller hands them: each quantized input in its serialized dtype."""
    native_inputs = []
    for array, quant in zip(arrays, artifact.input_quantization):
        if quant is None:
            native_inputs.append(array)
            continue
        scale, zero_point, dtype = quant
        info = np.iinfo(np.dtype(dtype))
        q = np.clip(np.round(array / scale[0]) + zero_point[0], info.min, info.max)
        native_inputs.append(q.astype(np.dtype(dtype)))
    return native_inputs


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
    native_inputs = quantized_inputs(artifact, arrays)
    outputs = []
    program = runtime.program
    for value, index in zip(runtime.run(native_inputs, mode=ExecutionMode.NATIVE).outputs, program.outputs):
        tensor = program.tensor(index)
        q = tensor.quantization
        if tensor.is_quantized_integer and q is not None:
            value = (value.astype(np.float64) - q.zero_point[0]) * q.scale[0]
        outputs.append(np.asarray(value, dtype=np.float32))
    return outputs
