"""Golden tensors: what a (case, profile) produced, stored as safetensors plus a JSON manifest,
and compared with a tolerance expressed in quantization steps where an observer gives one.

Files: ``golden/<case>.<profile>.safetensors`` and ``golden/<case>.<profile>.json``. The
manifest holds versions, seed, an input hash (case config, reference weights, inputs) and a
sha256 per tensor, so a stale golden (inputs changed) is told apart from numeric drift, and a
corrupted file is told apart from both. Writes happen only with ``--update-golden``, under a
per-case lock, each file replaced atomically, manifest last.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from harness.case import GoldenTolerance
from harness.overhead import overhead
from harness.pipeline import Pipeline, unwrap
from harness.results import package_versions

MANIFEST_SCHEMA = 1
# Element counts as changed when it moved more than this (absolute) from the golden.
CHANGED_EPS = 1e-6


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
    """Per evaluation sample, the scale of the observer whose fake-quant produced the QUANT
    output, found by running one private copy with every observer instrumented (no case
    annotation needed). Samples whose output no per-tensor observer produced are absent."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    root = copy.deepcopy(pipeline.quantized)
    produced: dict[int, torch.nn.Module] = {}
    for module in root.modules():
        if isinstance(module, ObserverBase):
            original = module.fake_quant

            def recording(x, _orig=original, _obs=module):
                out = _orig(x)
                produced[out.data_ptr()] = _obs
                return out

            module.fake_quant = recording
    scales: dict[str, float] = {}
    for name, sample in pipeline.built.inputs.evaluation.items():
        produced.clear()
        with torch.no_grad():
            out = pipeline.case.output(sample.call(root))
        scale = getattr(produced.get(out.data_ptr()), "_cached_scale", None)
        if isinstance(scale, torch.Tensor) and scale.numel() == 1 and float(scale) > 0:
            scales[name] = float(scale)
    return scales


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
    if case.export is not None:
        name = pipeline.export_sample_name
        tensors[f"export_output.{name}"] = pipeline.export_output("quant", name)
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


def input_hash(pipeline: Pipeline) -> str:
    """Hash of what determines the goldens besides library code: case identity, seed, PTQ
    config, reference weights and every input tensor."""
    h = hashlib.sha256()
    case = pipeline.case
    h.update(f"{case.name}|{pipeline.profile}|{case.seed}|{pipeline.ptq_config!r}".encode())
    for key, value in sorted(pipeline.built.module.state_dict().items()):
        h.update(key.encode() + tensor_sha256(value).encode())
    samples = list(enumerate(pipeline.built.inputs.calibration)) + sorted(pipeline.built.inputs.evaluation.items())
    for key, sample in samples:
        h.update(str(key).encode())
        for value in list(sample.args) + [sample.kwargs[k] for k in sorted(sample.kwargs)]:
            h.update(tensor_sha256(value).encode() if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


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


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write(pipeline: Pipeline, golden_dir: Path, collected: tuple[dict, dict] | None = None) -> dict[str, Any]:
    from safetensors.torch import save_file

    tensors, steps = collected or collect(pipeline)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "case": pipeline.case.name,
        "profile": pipeline.profile,
        "seed": pipeline.case.seed,
        "input_hash": input_hash(pipeline),
        "versions": package_versions(),
        "torch_threads": torch.get_num_threads(),
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
            _atomic_write(tensor_path, lambda tmp: save_file(tensors, tmp, metadata={"input_hash": manifest["input_hash"]}))
        _atomic_write(manifest_path, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=2, sort_keys=True)))
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


def compare_tensor(key: str, golden: torch.Tensor, current: torch.Tensor, step: float | None,
                   tol: GoldenTolerance) -> tuple[dict[str, Any], str | None]:
    if golden.dtype != current.dtype or golden.shape != current.shape:
        return {}, f"{key}: now {current.dtype} {list(current.shape)}, golden {golden.dtype} {list(golden.shape)}"
    if not golden.is_floating_point():
        changed = golden != current
        n = int(changed.sum())
        return {"changed": n}, (f"{key}: {n} of {golden.numel()} elements differ" if n else None)
    g, c = golden.to(torch.float64), current.to(torch.float64)
    nan_g, nan_c = torch.isnan(g), torch.isnan(c)
    if not torch.equal(nan_g, nan_c):
        return {}, f"{key}: NaN pattern differs ({int(nan_c.sum())} NaN now, {int(nan_g.sum())} in golden)"
    diff = (g - c).abs().nan_to_num(0.0)
    worst = int(diff.argmax()) if diff.numel() else 0
    worst_index = [int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)] if diff.numel() else []
    max_abs = float(diff.max()) if diff.numel() else 0.0
    changed = int((diff > CHANGED_EPS).sum())
    evidence = {"max_abs_diff": max_abs, "changed": changed, "elements": diff.numel(), "worst_index": worst_index}
    if step:
        max_steps = max_abs / step
        evidence.update({"step": step, "max_steps": max_steps})
        allowed = max(tol.min_changed_allowed, int(tol.max_changed_fraction * diff.numel()))
        where = f"worst at {worst_index}: {float(g.flatten()[worst]):.6g} -> {float(c.flatten()[worst]):.6g}"
        if max_steps > tol.max_steps:
            return evidence, (f"{key}: drifted {max_steps:.3g} steps ({max_abs:.3g} abs, step {step:.3g}) > "
                              f"{tol.max_steps:g} allowed; {changed} of {diff.numel()} elements changed; {where}")
        if changed > allowed:
            return evidence, (f"{key}: {changed} of {diff.numel()} elements changed (<= {max_steps:.3g} steps), "
                              f"more than the {allowed} allowed; {where}")
        return evidence, None
    bound = tol.atol + tol.rtol * g.abs()
    bad = int((diff > bound).sum())
    if bad:
        return evidence, (f"{key}: {bad} of {diff.numel()} elements beyond atol={tol.atol:g}, rtol={tol.rtol:g}; "
                          f"max |diff| {max_abs:.3g} at {worst_index}: {float(g.flatten()[worst]):.6g} -> "
                          f"{float(c.flatten()[worst]):.6g}")
    return evidence, None


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
