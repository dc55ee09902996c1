"""A PTQ algorithm run before wrapq is at least as accurate as wrapq alone, where it claims to be.

Against the same PTQ flow on the same float module without the algorithm (``ptq_alone``):

* ``layer_reconstruction`` (GPTQ's objective): for every linear the algorithm quantized, the
  relative output error ||X (W - W_q)^T||^2 / ||X W^T||^2 on the calibration inputs X the
  algorithm saw, with W_q the algorithm's weight and, for wrapq alone, the weight as its own
  weight observer fake-quantizes it. The gain in dB (positive: the algorithm is better) is gated
  by ``min_layer_gain_db``. The same on the evaluation inputs is reported: GPTQ fits its
  calibration inputs, and on few of them it loses on new ones.
* ``output_sqnr``: the case output's SQNR against the float reference, algorithm + PTQ minus
  PTQ alone, per evaluation sample, gated by ``min_output_gain_db`` (reported for every case).
* ``float_identity`` (SmoothQuant's folding): the transformed float module computes what the
  original did, to float32 rounding (``max_float_rel_diff``).

Limits are the case's, derived from the gains measured under native and scalar kernels; a
claim the case's algorithm does not make is reported, not gated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.model.algorithm import capture_linear_inputs
from harness.primitives.metrics import select_valid, sqnr_db


@dataclass(frozen=True)
class Settings:
    # dB; the smallest per-linear reconstruction gain on the calibration inputs (None: not gated)
    min_layer_gain_db: float | None = 0.0
    # dB; the smallest output SQNR gain on an evaluation sample (None: not gated)
    min_output_gain_db: float | None = None
    # the transformed float module's max |output change| / max |output|: above the float32 rounding
    # of the folded products (numbers in docs/algorithms.md)
    max_float_rel_diff: float = 1e-5


def _rel_error(x: torch.Tensor, weight: torch.Tensor, quantized: torch.Tensor) -> float:
    x = x.double()
    return float((x @ (weight.double() - quantized.double()).T).pow(2).sum() / (x @ weight.double().T).pow(2).sum())


def _db(baseline: float, ours: float) -> float:
    if ours == 0.0:
        return math.inf
    return 10.0 * math.log10(baseline / ours) if baseline > 0 else -math.inf


def _ptq_alone_weights(pipeline) -> dict[str, torch.Tensor]:
    """fp_name -> the weight as wrapq alone fake-quantizes it in QUANT."""
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    found = {}
    for module in pipeline.ptq_alone.modules():
        name = getattr(module, "fp_name", None)
        owner = getattr(module, "module", None)
        if isinstance(module, QuantModuleBase) and name and isinstance(owner, torch.nn.Linear):
            observer = module.get_observer("weight")
            if observer is not None:
                with torch.no_grad():
                    found[name] = observer.fake_quant(owner.weight.detach())
    return found


def run(pipeline) -> CheckResult:
    settings = pipeline.check_settings(CHECK)
    result = CheckResult()
    algorithm = pipeline.case.algorithm
    record = pipeline.algorithm_record
    rows = []
    if "layer_reconstruction" in algorithm.claims:
        baseline = _ptq_alone_weights(pipeline)
        call = pipeline.case.reference_call or (lambda m, sample: sample.call(m))
        evaluation = tuple(pipeline.sample(name) for name in pipeline.built.inputs.evaluation)
        eval_inputs = capture_linear_inputs(pipeline.built.module, evaluation, call)
        for name, quantized in sorted(record.grids.items()):
            if name not in record.layer_inputs:
                result.notes.append(f"{name}: not a linear, its reconstruction is not measured")
                continue
            weight, calib = record.original_weights.get(name), record.layer_inputs.get(name)
            if weight is None or calib is None or name not in baseline:
                result.fail(f"{name}: no original weight, calibration input or wrapq-alone weight to compare")
                continue
            ours = record.weights[name]
            row = {
                "linear": name,
                "calib_gain_db": _db(_rel_error(calib, weight, baseline[name]), _rel_error(calib, weight, ours)),
                "eval_gain_db": _db(
                    _rel_error(eval_inputs[name], weight, baseline[name]), _rel_error(eval_inputs[name], weight, ours)
                ),
            }
            rows.append(row)
        if not rows:
            result.fail("the algorithm claims layer reconstruction but quantized no linear the harness can compare")
        else:
            worst = min(rows, key=lambda r: r["calib_gain_db"])
            result.metrics["layer_gain_db"] = worst["calib_gain_db"]
            result.metrics["layer_gain_db_eval"] = min(r["eval_gain_db"] for r in rows)
            result.gate(
                f"layer reconstruction gain on the calibration inputs ({worst['linear']}, dB)",
                worst["calib_gain_db"],
                settings.min_layer_gain_db,
                upper=False,
            )
    outputs = []
    for sample_name in pipeline.built.inputs.evaluation:
        reference = pipeline.output("reference", sample_name)
        valid = pipeline.sample(sample_name).valid_tokens
        ref = select_valid(reference, valid)
        gain = sqnr_db(ref, select_valid(pipeline.output("quant", sample_name), valid)) - sqnr_db(
            ref, select_valid(pipeline.output("ptq_alone", sample_name), valid)
        )
        outputs.append({"sample": sample_name, "output_gain_db": gain})
        result.metrics[f"output_gain_db[{sample_name}]" if sample_name != "default" else "output_gain_db"] = gain
    if "output_sqnr" in algorithm.claims:
        for row in outputs:
            result.gate(
                f"output SQNR gain over wrapq alone [{row['sample']}] (dB)",
                row["output_gain_db"],
                settings.min_output_gain_db,
                upper=False,
            )
    else:
        result.notes.append(
            f"{algorithm.name} makes no output-accuracy claim here: the output gain is reported, not gated"
        )
    if "float_identity" in algorithm.claims:
        if record.float_max_rel_diff is None:
            result.fail("the algorithm claims float identity but its run measured no float output change")
        else:
            result.metrics["float_rel_diff"] = record.float_max_rel_diff
            result.gate(
                "transformed float module vs original, max |diff| / max |output|",
                record.float_max_rel_diff,
                settings.max_float_rel_diff,
            )
    result.evidence.update({"layers": rows, "outputs": outputs, "claims": list(algorithm.claims)})
    return result


CHECK = Check(
    name="algorithm_gain",
    run=run,
    applies=requires_capability("algorithm"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    metrics=(
        Metric(
            "layer_gain_db",
            better="higher",
            unit="dB",
            limit="min_layer_gain_db",
            label="layer reconstruction gain (calibration)",
        ),
        Metric("layer_gain_db_eval", better="higher", unit="dB", label="layer reconstruction gain (evaluation)"),
        Metric(
            "float_rel_diff", better="lower", limit="max_float_rel_diff", label="float change of the transformed module"
        ),
        Metric(
            "output_gain_db",
            better="higher",
            unit="dB",
            limit="min_output_gain_db",
            label="output SQNR gain over wrapq alone",
            headline=True,
        ),
    ),
    report=EVIDENCE_DETAILS,
)
