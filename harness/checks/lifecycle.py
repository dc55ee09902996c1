"""NO_QUANT -> CALIB -> QUANT as tico defines it: a fresh wrapper tree starts in NO_QUANT,
enable_calibration() moves every quant module to CALIB, freeze_qparams() to QUANT, and the
forward pass works (finite output) in each mode; prepare()/convert() land in CALIB/QUANT."""

import copy

import torch

from harness.checks.base import Check, CheckResult
from harness.primitives.lifecycle_ops import enable_calibration, freeze_qparams, wrap_noquant
from harness.primitives.metrics import nonfinite_summary


def _modes(root) -> set[str]:
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    return {m._mode.name for m in root.modules() if isinstance(m, QuantModuleBase)}


def run(pipeline) -> CheckResult:
    result = CheckResult()
    case = pipeline.case
    inputs = pipeline.built.inputs
    # A fresh tree: the shared NO_QUANT one may already have run forwards (lazy wrappers).
    root = wrap_noquant(case, copy.deepcopy(pipeline.built.module), pipeline.ptq_config)

    def step(expected: str, samples) -> None:
        modes = _modes(root)
        result.evidence[expected] = sorted(modes)
        if modes != {expected}:
            result.fail(f"expected every quant module in {expected}, found {sorted(modes)}")
        for i, sample in enumerate(samples):
            try:
                with torch.no_grad():
                    out = case.output(sample.call(root))
            except Exception as exc:  # noqa: BLE001 - a forward failing in a mode is the finding
                result.fail(f"forward in {expected} mode raised {type(exc).__name__}: {exc}")
                return
            problem = nonfinite_summary(out)
            if problem:
                result.fail(f"forward in {expected} mode (sample {i}) produced {problem}")

    step("NO_QUANT", [inputs.evaluation["default"]])
    enable_calibration(root)
    step("CALIB", inputs.calibration)
    freeze_qparams(root)
    step("QUANT", [inputs.evaluation["default"]])
    public = _modes(pipeline.quantized)
    if public != {"QUANT"}:
        result.fail(f"after prepare()/convert() the tree is in {sorted(public)}, expected QUANT")
    return result


CHECK = Check(name="lifecycle", run=run, description=__doc__.splitlines()[0])
