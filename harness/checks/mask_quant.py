"""The attention mask survives fake-quantization: in QUANT mode, valid pairs stay exactly 0,
the fill value is not clamped by the mask observer, and every masked key still gets softmax
weight below 1e-6 in each valid query row. Catches the calibrated-without-padding hazard
(mask observer scale 1 / zero-point 0 turns -120 into 0)."""

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.metrics import nonfinite_summary

MAX_MASKED_WEIGHT = 1e-6


def _judge(probe, result: CheckResult) -> None:
    label = f"QUANT mask [{probe.label}]"
    mask = probe.mask.detach().to(torch.float64)
    if mask.dim() == 3:
        mask = mask[:, None]
    valid = probe.valid_tokens.to(torch.bool)
    problem = nonfinite_summary(mask)
    if problem:
        result.fail(f"{label}: has {problem}")
        return
    pair_valid = probe.allowed_pairs()[:, None].expand_as(mask)
    masked = ~pair_valid
    nonzero_valid = int((mask[pair_valid] != 0).sum())
    if nonzero_valid:
        result.fail(f"{label}: {nonzero_valid} valid pairs are no longer exactly 0 after fake-quant")
    if not bool(masked.any()):
        return
    masked_values = mask[masked]
    worst_fill = float(masked_values.max())
    result.metrics[f"fill_after_quant[{probe.label}]"] = worst_fill
    if abs(worst_fill - probe.fill_value) > 1e-3 * abs(probe.fill_value):
        result.fail(
            f"{label}: fill value {probe.fill_value} became {worst_fill:.6g} after fake-quant (observer clamps it)"
        )
    query_valid = valid[:, None, :, None].expand_as(mask)
    weights = torch.softmax(mask, dim=-1)  # zero logits: the mask alone decides the weights
    leak = weights[masked & query_valid]
    worst = float(leak.max()) if leak.numel() else 0.0
    result.metrics[f"max_masked_weight[{probe.label}]"] = worst
    if worst >= MAX_MASKED_WEIGHT:
        result.fail(
            f"{label}: a masked key keeps softmax weight {worst:.3g} (limit {MAX_MASKED_WEIGHT:g}): padding "
            f"leaks into attention"
        )


def run(pipeline) -> CheckResult:
    result = CheckResult()
    probes = pipeline.case_probe(
        "mask_probes[quant]", lambda: pipeline.case.mask.probes(pipeline.quantized, pipeline.built)
    )
    if not any(bool((~p.allowed_pairs()).any()) for p in probes):
        result.fail("no mask probe masks any pair, so survival of the fill value cannot be verified")
    for probe in probes:
        _judge(probe, result)
    return result


CHECK = Check(
    name="mask_quant",
    run=run,
    applies=requires_capability("mask"),
    description=__doc__.splitlines()[0],
    metrics=(
        Metric("max_masked_weight", label="max masked softmax weight"),
        Metric("fill_after_quant", better=None, label="mask fill after fake-quant"),
    ),
    report=EVIDENCE_DETAILS,
)
