"""Golden tensors: what a (case, profile) produced, stored as safetensors plus a JSON manifest,
and compared portably (harness/golden/portable.py): a clean run on another CPU passes, a defect fails.

Files: ``golden/<case>.<profile>.safetensors`` and ``golden/<case>.<profile>.json``. The
manifest holds versions, seed, the platform that wrote it, an input hash over what the case
declares (never float bits), a sketch of every float input compared with a tolerance, and a
sha256 per tensor, so a stale golden (inputs changed) is told apart from numeric drift, and a
corrupted file is told apart from both. Writes happen only with ``--update-golden``: each item
stages its golden (``stage``), and the controller promotes every staged golden at the end of
the run (``promote``), under a per-case file lock, each file replaced atomically, manifest
last -- so an interrupted run rewrites nothing, and the run says what it rewrote.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.golden import portable
from harness.golden.golden_store import (  # noqa: F401 - the golden API callers use lives there
    MANIFEST_SCHEMA,
    STAGING,
    GoldenError,
    golden_set_id,
    load,
    orphans,
    paths,
    promote,
    staging_dir,
    tensor_sha256,
    update_command,
    write_files,
)
from harness.golden.platform_info import platform_differences, platform_record  # noqa: F401 - re-exported
from harness.golden.portable import GoldenTolerance
from harness.pipeline import Pipeline
from harness.primitives.lifecycle_ops import unwrap
from harness.primitives.observer_trace import producing_observers
from harness.primitives.stage_engine import StageError
from harness.records.results import package_versions
from harness.tico_facts.tico_identity import identity

# A declared float input counts as changed when its sketch moved more than this fraction of
# its sum |x|. Rounding noise across kernel selections moves it by ~1e-7 (scripts/golden_noise.py);
# a changed seed, init or input generator moves it by order 1.
SKETCH_REL = 1e-4


# -- what is stored ------------------------------------------------------------------


def output_observer_scales(pipeline: Pipeline) -> dict[str, float]:
    """Per evaluation sample, the scale of the per-tensor observer whose fake-quant produced the
    QUANT output (harness/primitives/observer_trace.py). Samples no such observer produced are absent."""
    case = pipeline.case
    outputs = {
        name: (lambda root, _s=sample: case.output(_s.call(root)))
        for name, sample in pipeline.built.inputs.evaluation.items()
    }
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
        tables = pipeline.case_probe(
            "rotary_tables", lambda: case.rotary.tables(pipeline.wrapped, pipeline.built.module, pipeline.built)
        )
        for table in tables:
            tensors[f"rotary.{table.label}.cos"], tensors[f"rotary.{table.label}.sin"] = table.wrapper
    if case.mask is not None:
        probes = pipeline.case_probe("mask_probes[quant]", lambda: case.mask.probes(pipeline.quantized, pipeline.built))
        for probe in probes:
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
    if case.algorithm is not None:  # what runs before wrapq (harness/model/algorithm.py) is declared too
        h.update(f"|algorithm {case.algorithm.name}: {case.algorithm.description}".encode())
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
    return {
        label: _sketch(v)
        for label, v in _declared_tensors(pipeline)
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def sketch_moves(stored: dict[str, list[float]], current: dict[str, list[float]]) -> dict[str, float]:
    """Per input in both, how far its sketch moved, as a fraction of its sum |x|."""
    moves = {}
    for label in sorted(set(stored) & set(current)):
        s, c = stored[label], current[label]
        moves[label] = max(abs(a - b) for a, b in zip(s, c)) / max(abs(s[1]), abs(c[1]), 1e-30)
    return moves


def sketch_changes(stored: dict[str, list[float]], current: dict[str, list[float]]) -> list[str]:
    """Inputs whose content moved more than rounding noise can move it (``SKETCH_REL``)."""
    return [
        f"{label} (moved {move:.2g} of its sum |x|)"
        for label, move in sketch_moves(stored, current).items()
        if move > SKETCH_REL
    ]


# -- writing ---------------------------------------------------------------------------


def stage(pipeline: Pipeline, staging: Path, collected: tuple[dict, dict] | None = None) -> dict[str, Any]:
    """Write this (case, profile)'s golden into the run's staging directory; ``promote`` moves
    it into place when the run ends."""
    return write(pipeline, staging, collected)


@dataclass(frozen=True)
class Rewrite:
    """What rewriting one golden changes: ``kind`` is 'new', 'changed' (beyond the measured
    noise, or stale inputs, or another tensor set), 'noise' (bits moved within the portable
    limits) or 'unchanged' (identical tensors)."""

    kind: str
    detail: str


def classify_rewrite(
    golden_dir: Path,
    case: str,
    profile: str,
    nodeid: str,
    current: dict[str, torch.Tensor],
    current_hash: str,
    tolerance: GoldenTolerance,
) -> Rewrite:
    try:
        manifest, stored = load(golden_dir, case, profile, nodeid)
    except GoldenError as exc:
        return Rewrite("new", f"no usable golden before ({exc})")
    if manifest.get("input_hash") != current_hash:
        return Rewrite("changed", "the case's declared inputs changed (the old golden is stale)")
    if set(stored) != set(current):
        gone, added = sorted(set(stored) - set(current)), sorted(set(current) - set(stored))
        return Rewrite("changed", f"tensor set changed: gone {gone[:5]}, new {added[:5]}")
    if all(tensor_sha256(stored[k]) == tensor_sha256(current[k]) for k in stored):
        return Rewrite("unchanged", "identical tensors")
    measured = portable.load_measured_noise(golden_dir).get("cases", {}).get(case, {})
    _, problems = compare(stored, current, manifest, tolerance, measured)
    if problems:
        return Rewrite("changed", f"{len(problems)} tensor(s) beyond the portable limits, e.g. {problems[0]}")
    return Rewrite("noise", "bits moved within the measured platform noise")


def tico_record() -> dict[str, Any]:
    """Which tico wrote a golden, without where it was installed (a path says nothing of the code)."""
    record = identity()
    return {k: record[k] for k in ("version", "install", "source_sha256", "git_commit", "git_dirty") if k in record}


def write(
    pipeline: Pipeline, golden_dir: Path, collected: tuple[dict, dict] | None = None, run_id: str | None = None
) -> dict[str, Any]:
    tensors, steps = collected or collect(pipeline)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "case": pipeline.case.name,
        "profile": pipeline.profile,
        "seed": pipeline.case.seed,
        "input_hash": input_hash(pipeline),
        "input_sketch": input_sketch(pipeline),
        "versions": package_versions(),
        "tico": tico_record(),
        "platform": platform_record(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tensors": {
            key: {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "sha256": tensor_sha256(t),
                "step": steps.get(key),
            }
            for key, t in sorted(tensors.items())
        },
    }
    if run_id:
        manifest["run_id"] = run_id  # a run's own goldens (harness/golden/baseline.py): whose they are
    write_files(golden_dir, pipeline.case.name, pipeline.profile, tensors, manifest)
    return manifest


def kept_by_run(golden_dir: Path, case: str, profile: str, run_id: str | None) -> bool:
    """Whether ``golden_dir`` holds this (case, profile)'s golden as written by run ``run_id``."""
    manifest_path = paths(golden_dir, case, profile)[1]
    try:
        return bool(run_id) and json.loads(manifest_path.read_text()).get("run_id") == run_id
    except (OSError, ValueError):
        return False


# -- reading and comparing ---------------------------------------------------------------


_EXPLAIN = {
    "float_rel": "max |diff| / max |golden|",
    "scale_rel": "relative scale change",
    "zero_point_abs": "zero point change",
    "err_ratio": "rms move / the output's own quantization error rms",
    "int_changed": "elements changed in an integer tensor",
    "nan_pattern": "NaN positions differ",
    "shape/dtype": "shape or dtype changed",
}


def compare(
    stored: dict[str, torch.Tensor],
    current: dict[str, torch.Tensor],
    manifest: dict[str, Any],
    tolerance: GoldenTolerance,
    measured: dict[str, dict[str, float]],
) -> tuple[dict[str, Any], list[str]]:
    """Portable comparison of every stored tensor (harness/golden/portable.py): evidence per tensor
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
            problems.append(
                f"{key}: now {current[key].dtype} {list(current[key].shape)}, "
                f"golden {stored[key].dtype} {list(stored[key].shape)}"
            )
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
    moved = [f"{k} {then.get(k)} -> {now.get(k)}" for k in sorted(set(now) | set(then)) if then.get(k) != now.get(k)]
    sources = (manifest.get("tico") or {}).get("source_sha256")
    if sources and sources != tico_record().get("source_sha256"):
        moved.append(f"tico sources {sources[:12]} -> {str(tico_record().get('source_sha256'))[:12]}")
    return moved
