"""The wrapper's call contract beyond the case's samples: each option a user may pass (explicit
position ids, tuple outputs, hidden states, other mask forms) gives Hugging Face's answer, and each
input the wrapper documents as unsupported is refused with its own error, not accepted and not
failed somewhere downstream."""

import copy
import re
from dataclasses import dataclass

from harness.checks.base import EVIDENCE_DETAILS, Check, CheckResult, Metric, requires_capability
from harness.primitives.tensor_compare import compare_each


@dataclass(frozen=True)
class Settings:
    """An option's answer vs HF's, torch.testing-style closeness (NO_QUANT: wrapping alone)."""

    atol: float = 1e-5
    rtol: float = 1e-5


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _call(fn, *args):
    """(answer, None) or (None, "Type: message") for any exception the call raises."""
    try:
        return fn(*args), None
    except Exception as exc:  # noqa: BLE001 - every error is judged by the probe's expectation
        return None, _error(exc)


def _judge_refusal(probe, answer_error, result: CheckResult) -> None:
    label = f"[{probe.label}]"
    _, error = answer_error
    result.evidence[probe.label] = {"expected_refusal": probe.refusal, "raised": error}
    if error is None:
        result.fail(f"{label} the wrapper accepted an input its contract refuses (expected /{probe.refusal}/)")
    elif not re.search(probe.refusal, error):
        result.fail(f"{label} refused with {error!r}, not the wrapper's own refusal /{probe.refusal}/")


def _judge_answer(pipeline, probe, answer_error, result: CheckResult, th, tree) -> None:
    """Hold the wrapper's answer to HF's (``reference``) or to tico's other path on the same tree (``twin``)."""
    label = f"[{probe.label}]"
    answer, error = answer_error
    if error is not None:
        side = "Hugging Face's module" if probe.reference is not None else "tico's other path"
        result.fail(f"{label} the wrapper raised {error!r} on a call {side} accepts")
        return
    if probe.reference is not None:
        expected, ref_error = _call(probe.reference, copy.deepcopy(pipeline.built.module))
        other = "Hugging Face's"
    else:
        expected, ref_error = _call(probe.twin, copy.deepcopy(tree))
        other = "the twin path's"
    if ref_error is not None:
        result.fail(f"{label} the reference call raised {ref_error!r}: the probe is malformed")
        return
    pick = probe.pick or (lambda out: [pipeline.case.output(out)])
    (ours, ours_error), (theirs, theirs_error) = _call(pick, answer), _call(pick, expected)
    if ours_error or theirs_error:
        side = "the wrapper's" if ours_error else other
        result.fail(f"{label} {side} answer lacks what the probe picks: {ours_error or theirs_error}")
        return
    if len(ours) != len(theirs):
        result.fail(f"{label} the wrapper answered {len(ours)} tensor(s), {other} answer {len(theirs)}")
        return
    worst, problems = compare_each(
        lambda index: f"{label} tensor {index}",
        [t.detach() for t in theirs],
        [t.detach() for t in ours],
        atol=th.atol,
        rtol=th.rtol,
        valid_tokens=probe.valid_tokens,
    )
    for problem in problems:
        result.fail(problem)
    result.evidence[probe.label] = {"tensors": len(ours), "max_abs_diff": worst}


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    probes = pipeline.case_probe("call_probes", lambda: pipeline.case.calls.probes(pipeline.built))
    if not probes:
        result.fail("the case's call contract lists no probe: a check that makes no call cannot fail")
        return result
    refusals = answers = 0
    for probe in probes:
        tree = pipeline.wrapped if probe.mode == "noquant" else pipeline.quantized
        answer_error = _call(probe.call, copy.deepcopy(tree))
        if probe.refusal is not None:
            refusals += 1
            _judge_refusal(probe, answer_error, result)
        else:
            answers += 1
            _judge_answer(pipeline, probe, answer_error, result, th, tree)
    result.metrics["refusals_probed"] = refusals
    result.metrics["options_probed"] = answers
    return result


CHECK = Check(
    name="call_contract",
    run=run,
    applies=requires_capability("calls"),
    description=__doc__.splitlines()[0],
    settings=Settings,
    report=EVIDENCE_DETAILS,
    metrics=(
        Metric("options_probed", better=None, label="options probed"),
        Metric("refusals_probed", better=None, label="refusals probed"),
    ),
)
