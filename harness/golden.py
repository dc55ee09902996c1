"""Golden tensors: what a (case, profile) produced, stored as safetensors plus a JSON manifest,
and compared portably (harness/portable.py): a clean run on another CPU passes, a defect fails.

Files: ``golden/<case>.<profile>.safetensors`` and ``golden/<case>.<profile>.json``. The
manifest holds versions, seed, the platform that wrote it, an input hash over what the case
declares (never float bits), a sketch of every float input compared with a tolerance, and a
sha256 per tensor, so a stale golden (inputs changed) is told apart from numeric drift, and a
corrupted file is told apart from both. Writes happen only with ``--update-golden``, under a
per-case lock, each file replaced atomically, manifest last.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from harness import portable
from harness.case import GoldenTolerance
from harness.observer_trace import producing_observers
from harness.overhead import overhead
from harness.pipeline import Pipeline, StageError, unwrap
from harness.results import atomic_write_bytes, atomic_write_text, package_versions

# 2: portable comparison (input hash without float bits, input sketch, platform record).
MANIFEST_SCHEMA = 2
# A declared float input counts as changed when its sketch moved more than this fraction of
# its sum |x|. Rounding noise across kernel selections moves it by ~1e-7 (scripts/golden_noise.py);
# a changed seed, init or input generator moves it by order 1.
SKETCH_REL = 1e-4


class GoldenError(Exception):
    """A golden file is missing, unreadable or inconsistent; the message says what to do."""


def tensor_sha256(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(str(t.dtype).encode() + str(tuple(t.shape)).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def paths(golden_dir: Path, case: str, profile: str) -> tuple[Path, Path]:
    return golden_dir / f"{case}.{profile}.safetensors", golden_dir / f"{case}.{profile}.json"


def update_command(nodeid: str) -> str:
    return f"./scripts/env.sh pytest '{nodeid}' --update-golden"


# -- what is stored ------------------------------------------------------------------


def output_observer_scales(pipeline: Pipeline) -> dict[str, float]:
    """Per evaluation sample, the scale of the per-tensor observer whose fake-quant produced the
    QUANT output (harness/observer_trace.py). Samples no such observer produced are absent."""
    case = pipeline.case
    outputs = {name: (lambda root, _s=sample: case.output(_s.call(root)))
               for name, sample in pipeline.built.inputs.evaluation.items()}
    scales: dict[str, float] = {}
    for name, (_, observer) in producing_observers(pipeline.quantized, outputs).items():
        scale = getattr(observer, "_cached_scale", None)
        if isinstance(scale, torch.Tensor) and scale.numel() == 1 and float(scale) > 0:
            scales[name] = float(scale)
    return scales


def pinned_export_output(pipeline: Pipeline) -> torch.Tensor | None:
    """The QUANT export adapter's output on the deployment profile, or None when the case has no
    export capability or its adapter cannot run (the stage failure is the export checks' to
    report: dynamic_vs_export fails on it, or holds it as a precise expectation). Never silent:
    the golden's tensor set then differs from one written while the adapter ran (gone or new
    ``export_output.*``), and the golden item fails."""
    if pipeline.case.export is None:
        return None
    try:
        return pipeline.export_output("quant", pipeline.export_sample_name)
    except StageError as err:
        if err.stage.startswith(("export_adapter[", "export_raw_output[", "export_output[")):
            return None
        raise  # an upstream stage (reference, calibration, ...) failed: the golden cannot be computed


def collect(pipeline: Pipeline) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The tensors that matter for regression, and the quantization step of those that have one."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    case, tensors, steps = pipeline.case, {}, {}
    scales = output_observer_scales(pipeline)
    for name in pipeline.built.inputs.evaluation:
        tensors[f"reference_output.{name}"] = pipeline.output("reference", name)
        tensors[f"quant_output.{name}"] = pipeline.output("quant", name)
        if name in scales:
            steps[f"quant_output.{name}"] = scales[name]
    export_output = pinned_export_output(pipeline)
    if export_output is not None:
        name = pipeline.export_sample_name
        tensors[f"export_output.{name}"] = export_output
        if f"quant_output.{name}" in steps:
            steps[f"export_output.{name}"] = steps[f"quant_output.{name}"]
    for path, module in unwrap(pipeline.quantized).named_modules():
        if isinstance(module, ObserverBase):
            for attr in ("_cached_scale", "_cached_zp"):
                value = getattr(module, attr, None)
                if isinstance(value, torch.Tensor) and value.numel():
                    tensors[f"qparams.{path}.{attr.removeprefix('_cached_')}"] = value
    if case.rotary is not None:
        for table in case.rotary.tables(pipeline.wrapped, pipeline.built.module, pipeline.built):
            tensors[f"rotary.{table.label}.cos"], tensors[f"rotary.{table.label}.sin"] = table.wrapper
    if case.mask is not None:
        for probe in case.mask.probes(pipeline.quantized, pipeline.built):
            tensors[f"mask_quant.{probe.label}"] = probe.mask
    return {k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}, steps


def _leaves(label: str, value: Any) -> list[tuple[str, Any]]:
    """Tensors and plain values inside nested tuples, lists and dicts (e.g. (cos, sin) or a
    past (K, V)), each with a path label; other objects by type only (their repr may hold an
    address or rounded floats)."""
    if isinstance(value, (tuple, list)):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(f"{label}[{i}]", item)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value, key=str) for leaf in _leaves(f"{label}[{k!r}]", value[k])]
    if isinstance(value, (torch.Tensor, str, int, float, bool, type(None))):
        return [(label, value)]
    return [(label, f"<{type(value).__module__}.{type(value).__qualname__}>")]


def _declared_tensors(pipeline: Pipeline) -> list[tuple[str, Any]]:
    """Every value the case declares: reference weights, then each sample's arguments."""
    named = [(f"weight.{k}", v) for k, v in sorted(pipeline.built.module.state_dict().items())]
    samples = [(f"calibration[{i}]", s) for i, s in enumerate(pipeline.built.inputs.calibration)]
    samples += [(f"evaluation[{k}]", s) for k, s in sorted(pipeline.built.inputs.evaluation.items())]
    for label, sample in samples:
        for i, v in enumerate(sample.args):
            named += _leaves(f"{label}.arg{i}", v)
        for k in sorted(sample.kwargs):
            named += _leaves(f"{label}.{k}", sample.kwargs[k])
    return named


def input_hash(pipeline: Pipeline) -> str:
    """Hash of what the case declares, independent of float bits: case identity, seed, PTQ
    config, every weight's and input's name, dtype and shape, non-float inputs exactly (token
    ids, positions, boolean masks) and non-tensor arguments. Float contents are not hashed --
    they differ across CPUs (randn's vectorised path, float-computed inputs such as a producer
    layer's K/V) -- but summarised by ``input_sketch`` and compared with a tolerance."""
    h = hashlib.sha256()
    case = pipeline.case
    h.update(f"{case.name}|{pipeline.profile}|{case.seed}|{pipeline.ptq_config!r}".encode())
    for label, value in _declared_tensors(pipeline):
        h.update(label.encode())
        if not isinstance(value, torch.Tensor):
            h.update(repr(value).encode())
        elif value.is_floating_point():
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        else:
            h.update(tensor_sha256(value).encode())
    return h.hexdigest()


def _sketch(t: torch.Tensor) -> list[float]:
    """Three float64 sums that move with any change of content but only by rounding noise
    across CPUs: sum, sum of |x|, and a sum weighted by a fixed position pattern."""
    x = t.detach().reshape(-1).to(torch.float64)
    pattern = torch.cos(torch.arange(x.numel(), dtype=torch.float64) * 0.7548776662466927)
    return [float(x.sum()), float(x.abs().sum()), float((x * pattern).sum())]


def input_sketch(pipeline: Pipeline) -> dict[str, list[float]]:
    """Per float weight and input tensor, its sketch (see ``_sketch``)."""
    return {label: _sketch(v) for label, v in _declared_tensors(pipeline)
            if isinstance(v, torch.Tensor) and v.is_floating_point()}


def sketch_moves(stored: dict[str, list[float]], current: dict[str, list[float]]) -> dict[str, float]:
    """Per input in both, how far its sketch moved, as a fraction of its sum |x|."""
    moves = {}
    for label in sorted(set(stored) & set(current)):
        s, c = stored[label], current[label]
        moves[label] = max(abs(a - b) for a, b in zip(s, c)) / max(abs(s[1]), abs(c[1]), 1e-30)
    return moves


def sketch_changes(stored: dict[str, list[float]], current: dict[str, list[float]]) -> list[str]:
    """Inputs whose content moved more than rounding noise can move it (``SKETCH_REL``)."""
    return [f"{label} (moved {move:.2g} of its sum |x|)"
            for label, move in sketch_moves(stored, current).items() if move > SKETCH_REL]


KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")


@functools.lru_cache(maxsize=1)
def _machine() -> tuple[str, str, str]:
    """(CPU model, architecture, BLAS): fixed for the process, read once (every golden item asks)."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = next((line.strip(" -") for line in torch.__config__.show().splitlines() if "Math Kernel Library" in line
                 or "OpenBLAS" in line), "unknown")
    return cpu, platform.machine(), blas


def platform_record() -> dict[str, Any]:
    """What decides float bits on this machine: CPU, torch's kernel selection, BLAS, threads
    and the environment variables that override them. Recorded in each manifest, so a golden
    failure can say whether the golden came from another platform."""
    cpu, machine, blas = _machine()
    return {
        "cpu": cpu,
        "machine": machine,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
    }


def platform_differences(manifest: dict[str, Any]) -> list[str]:
    """How the platform that wrote the golden differs from this one (empty: the same)."""
    then, now = manifest.get("platform") or {}, platform_record()
    if not then:
        return ["golden written before platforms were recorded"]
    return [f"{k} {then.get(k)!r} -> {now.get(k)!r}" for k in ("cpu", "cpu_capability", "blas", "torch_threads", "env")
            if then.get(k) != now.get(k)]


# -- writing ---------------------------------------------------------------------------


@contextmanager
def _case_lock(golden_dir: Path, case: str, profile: str) -> Iterator[None]:
    golden_dir.mkdir(parents=True, exist_ok=True)
    with open(golden_dir / f".{case}.{profile}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write(pipeline: Pipeline, golden_dir: Path, collected: tuple[dict, dict] | None = None) -> dict[str, Any]:
    from safetensors.torch import save

    tensors, steps = collected or collect(pipeline)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "case": pipeline.case.name,
        "profile": pipeline.profile,
        "seed": pipeline.case.seed,
        "input_hash": input_hash(pipeline),
        "input_sketch": input_sketch(pipeline),
        "versions": package_versions(),
        "platform": platform_record(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tensors": {
            key: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": tensor_sha256(t),
                  "step": steps.get(key)}
            for key, t in sorted(tensors.items())
        },
    }
    tensor_path, manifest_path = paths(golden_dir, pipeline.case.name, pipeline.profile)
    with _case_lock(golden_dir, pipeline.case.name, pipeline.profile):
        with overhead("golden_io"):
            atomic_write_bytes(tensor_path, save(tensors, metadata={"input_hash": manifest["input_hash"]}))
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


# -- reading and comparing ---------------------------------------------------------------


def load(golden_dir: Path, case: str, profile: str, nodeid: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Manifest and tensors, verified against each other; GoldenError with the fix otherwise."""
    with overhead("golden_io"):
        return _load(golden_dir, case, profile, nodeid)


def _load(golden_dir: Path, case: str, profile: str, nodeid: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    tensor_path, manifest_path = paths(golden_dir, case, profile)
    if not tensor_path.exists() and not manifest_path.exists():
        raise GoldenError(f"no golden for {case}[{profile}] in {golden_dir}; create it with: {update_command(nodeid)}")
    if not manifest_path.exists():
        raise GoldenError(f"golden manifest {manifest_path.name} is missing; regenerate with: {update_command(nodeid)}")
    if not tensor_path.exists():
        raise GoldenError(f"golden tensors {tensor_path.name} are missing; regenerate with: {update_command(nodeid)}")
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("schema") != MANIFEST_SCHEMA or not isinstance(manifest.get("tensors"), dict):
            raise ValueError(f"unsupported manifest schema {manifest.get('schema')!r}")
    except (ValueError, OSError) as exc:
        raise GoldenError(f"golden manifest {manifest_path.name} is unreadable: {exc}") from exc
    try:
        tensors = load_file(str(tensor_path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for bad files
        raise GoldenError(f"golden tensors {tensor_path.name} are unreadable ({type(exc).__name__}: {exc}); "
                          f"regenerate with: {update_command(nodeid)}") from exc
    listed, stored = set(manifest["tensors"]), set(tensors)
    if listed != stored:
        raise GoldenError(f"golden {tensor_path.name} does not match its manifest: "
                          f"missing {sorted(listed - stored)[:5]}, unlisted {sorted(stored - listed)[:5]}")
    for key, entry in manifest["tensors"].items():
        t = tensors[key]
        if str(t.dtype).removeprefix("torch.") != entry["dtype"] or list(t.shape) != entry["shape"]:
            raise GoldenError(f"golden tensor {key}: file holds {t.dtype} {list(t.shape)}, "
                              f"manifest says {entry['dtype']} {entry['shape']}")
        if tensor_sha256(t) != entry["sha256"]:
            raise GoldenError(f"golden tensor {key}: checksum mismatch, the file was modified or corrupted; "
                              f"regenerate with: {update_command(nodeid)}")
    return manifest, tensors


_EXPLAIN = {
    "float_rel": "max |diff| / max |golden|",
    "scale_rel": "relative scale change",
    "zero_point_abs": "zero point change",
    "err_ratio": "rms move / the output's own quantization error rms",
    "int_changed": "elements changed in an integer tensor",
    "nan_pattern": "NaN positions differ",
    "shape/dtype": "shape or dtype changed",
}


def compare(stored: dict[str, torch.Tensor], current: dict[str, torch.Tensor], manifest: dict[str, Any],
            tolerance: GoldenTolerance, measured: dict[str, dict[str, float]]) -> tuple[dict[str, Any], list[str]]:
    """Portable comparison of every stored tensor (harness/portable.py): evidence per tensor
    that moved at all, and one problem line per tensor over its limit."""
    steps = {k: v.get("step") for k, v in manifest["tensors"].items()}
    results = portable.compare(stored, current, steps, tolerance, measured)
    evidence: dict[str, Any] = {}
    problems: list[str] = []
    for key, r in results.items():
        if r.get("changed", 1):
            evidence[key] = {k: v for k, v in r.items() if isinstance(v, (int, float, str)) and v is not None}
        if r["score"] <= 1:
            continue
        by = r["by"]
        if by == "shape/dtype":
            problems.append(f"{key}: now {current[key].dtype} {list(current[key].shape)}, "
                            f"golden {stored[key].dtype} {list(stored[key].shape)}")
            continue
        line = f"{key}: {by} {r[by]:.3g} > limit {r['limit']:.3g} ({_EXPLAIN.get(by, by)})"
        if "max_abs_diff" in r:
            line += f"; max |diff| {r['max_abs_diff']:.3g}"
        if "max_steps" in r:
            line += f" ({r['max_steps']:.3g} steps)"
        if "changed" in r:
            line += f"; {int(r['changed'])} of {stored[key].numel()} elements changed"
        noise = (measured.get(key) or {}).get(by)
        if noise:
            line += f"; {r[by] / noise:.3g}x the largest value measured across kernel selections ({noise:.3g})"
        problems.append(line)
    return evidence, problems


def version_changes(manifest: dict[str, Any]) -> list[str]:
    now = package_versions()
    then = manifest.get("versions", {})
    return [f"{k} {then.get(k)} -> {now.get(k)}" for k in sorted(set(now) | set(then)) if then.get(k) != now.get(k)]


def golden_set_id(golden_dir: Path) -> str | None:
    """Identity of the committed golden set (hash of every manifest), for merge safety."""
    manifests = sorted(golden_dir.glob("*.json")) if golden_dir.is_dir() else []
    if not manifests:
        return None
    h = hashlib.sha256()
    for path in manifests:
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]
