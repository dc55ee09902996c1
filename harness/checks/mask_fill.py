"""The additive attention mask a wrapper builds: right shape, finite, 0 on every allowed
(query, key) pair -- both valid, and key <= query for causal masks -- and exactly the
configured fill value on every other pair."""

import torch

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.metrics import nonfinite_summary


def _judge(probe, result: CheckResult) -> None:
    mask = probe.mask.detach()
    label = f"mask [{probe.label}]"
    allowed = probe.allowed_pairs()
    batch, q_len, k_len = allowed.shape
    if mask.dim() == 3:
        mask = mask[:, None]  # (B, S, S) wrappers: judge as (B, 1, S, S)
    if tuple(mask.shape) != (batch, 1, q_len, k_len):
        result.fail(f"{label}: shape {tuple(probe.mask.shape)} != expected {(batch, 1, q_len, k_len)}")
        return
    problem = nonfinite_summary(mask)
    if problem:
        result.fail(f"{label}: has {problem}; fill values must be finite")
        return
    pair_valid = allowed[:, None]
    expected = torch.where(
        pair_valid, torch.zeros((), dtype=mask.dtype), torch.tensor(probe.fill_value, dtype=mask.dtype)
    )
    wrong = mask != expected
    wrong_valid = int((wrong & pair_valid).sum())
    wrong_padded = int((wrong & ~pair_valid).sum())
    result.evidence[probe.label] = {
        "shape": list(mask.shape),
        "fill_value": probe.fill_value,
        "valid_pairs": int(pair_valid.sum()),
        "padded_pairs": int((~pair_valid).sum()),
        "wrong_valid_pairs": wrong_valid,
        "wrong_padded_pairs": wrong_padded,
        "observed_values": sorted({float(v) for v in mask.unique()[:8]}),
    }
    result.metrics[f"wrong_pairs[{probe.label}]"] = wrong_valid + wrong_padded
    if wrong_valid:
        b, _, q, k = (int(i) for i in (wrong & pair_valid).nonzero()[0])
        result.fail(f"{label}: {wrong_valid} valid pairs are not 0, e.g. [{b},0,{q},{k}] = {float(mask[b, 0, q, k])}")
    if wrong_padded:
        b, _, q, k = (int(i) for i in (wrong & ~pair_valid).nonzero()[0])
        result.fail(
            f"{label}: {wrong_padded} pairs touching padding are not the fill value {probe.fill_value}, "
            f"e.g. [{b},0,{q},{k}] = {float(mask[b, 0, q, k])}"
        )


def run(pipeline) -> CheckResult:
    result = CheckResult()
    probes = pipeline.case_probe(
        "mask_probes[noquant]", lambda: pipeline.case.mask.probes(pipeline.wrapped, pipeline.built)
    )
    if not probes:
        result.fail("case mask capability returned no probes")
    if not any(bool((~p.allowed_pairs()).any()) for p in probes):
        result.fail("no mask probe masks any pair, so fill values cannot be verified")
    for probe in probes:
        _judge(probe, result)
    return result


CHECK = Check(
    name="mask_fill",
    run=run,
    applies=requires_capability("mask"),
    description=__doc__.splitlines()[0],
    metrics=(Metric("wrong_pairs", label="mask pairs wrong"),),
    report=EVIDENCE_DETAILS,
)
