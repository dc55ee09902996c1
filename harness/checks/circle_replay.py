"""The exported Circle model replayed in tico's reference runtime vs the torch QUANT output,
in absolute terms and in quantization steps of the Circle output tensor.

FAKE_QUANTIZE mode is always run and gated; NATIVE mode (integer kernels) is run where the
runtime supports the graph, and its outcome -- including "unsupported, because ..." -- is
recorded, never dropped."""

from harness.checks.base import Check, CheckResult, requires_capability
from harness.metrics import as_float, nonfinite_summary


def _steps(result: CheckResult, pipeline, mode: str, label: str, max_steps, mean_steps) -> None:
    torch_out = pipeline.export_output("quant", pipeline.export_sample_name)
    circle_out = pipeline.circle_output(mode)
    problem = nonfinite_summary(circle_out)
    if problem:
        result.fail(f"Circle {label} output has {problem}")
        return
    diff = (as_float(circle_out) - as_float(torch_out)).abs()
    scales = pipeline.circle.output_scales[0] if pipeline.circle.output_scales else ()
    metrics = {f"{mode}_max_abs_diff": float(diff.max()), f"{mode}_mean_abs_diff": float(diff.mean())}
    if len(scales) == 1 and scales[0] > 0:
        step = scales[0]
        metrics.update({f"{mode}_max_steps": float(diff.max()) / step, f"{mode}_mean_steps": float(diff.mean()) / step,
                        "output_scale": step})
        result.gate(f"Circle {label} max |diff| in steps", metrics[f"{mode}_max_steps"], max_steps)
        if mean_steps is not None or mode == "fake_quantize":
            result.gate(f"Circle {label} mean |diff| in steps", metrics[f"{mode}_mean_steps"], mean_steps)
    else:
        result.fail(f"Circle {label}: output tensor has no per-tensor scale ({len(scales)} scales), cannot express in steps")
    result.metrics.update(metrics)


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.case.thresholds
    artifact = pipeline.circle
    result.evidence["circle_file"] = getattr(artifact, "path", None)
    result.evidence["circle_bytes"] = len(artifact.binary)
    result.evidence["circle_cache"] = artifact.cache_status
    result.notes += artifact.notes
    _steps(result, pipeline, "fake_quantize", "FAKE_QUANTIZE", th.circle_max_steps, th.circle_mean_steps)
    try:
        pipeline.circle_output("native")
    except Exception as exc:  # noqa: BLE001 - the runtime's refusal is the finding
        cause = getattr(exc, "error_text", str(exc)).splitlines()[0]
        result.metrics["native_supported"] = False
        result.notes.append(f"NATIVE replay not run: tico's reference runtime rejected the graph: {cause}")
        result.evidence["native"] = cause
    else:
        result.metrics["native_supported"] = True
        _steps(result, pipeline, "native", "NATIVE", th.circle_native_max_steps, None)
    return result


CHECK = Check(name="circle_replay", run=run, applies=requires_capability("export"), description=__doc__.splitlines()[0])
