"""One item per (case, profile, check): it runs its check, judges the result against the case's
precise expectation (the findings it declares; on another tico, a finding gone is fixed), sets
aside what a base run already had (``--baseline``), and records what it found on its report
(``report.wrapq_record``). The tree above it is harness/run/collection.py."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from harness import compat
from harness.checks.base import Check, CheckResult
from harness.golden.baseline import pre_existing
from harness.model import sweep
from harness.model.case import Case, CaseDefinitionError
from harness.model.expectations import Judgement, judge
from harness.primitives.stage_engine import StageError
from harness.records import node_ids
from harness.records.overhead import overhead
from harness.records.results import jsonable, stage_line
from harness.run.session import state_of
from harness.tico_facts import findings_data

# Case capabilities that become item markers (``pytest -m rotary``).
CAPABILITY_MARKERS = ("export", "rotary", "mask", "language_model")
CAPABILITY_MARKERS += ("algorithm",)  # a PTQ algorithm before wrapq (harness/model/algorithm.py)
# Headline numbers worth a junit property each (scalars; the full record goes to results.json).
JUNIT_METRICS = (
    "peir",
    "sqnr_db",
    "mean_abs_diff",
    "max_abs_diff",
    "fake_quantize_max_steps",
    "missing_unexplained",
    "worst_score",
)
_MARKERS = pytest.StashKey[set]()
CAPABILITY_MARKERS += ("rotation_handoff",)  # a rotation algorithm (SpinQuant) before wrapq


def register_marker(config: pytest.Config, name: str, description: str) -> None:
    """Register a marker once, so ``--strict-markers`` accepts it and ``pytest --markers`` lists it."""
    registered = config.stash.setdefault(_MARKERS, set())
    if name not in registered:
        registered.add(name)
        config.addinivalue_line("markers", f"{name}: {description}")


def stage_problem(err: StageError) -> str:
    """A failed stage as one problem line, for expectations: "stage 'torch_export' failed: Type: first line"."""
    return stage_line(err.stage, err.error_type, err.error_text)


def _xfail_line(judgement: Judgement) -> str:
    """An expected failure in one line: the findings that occur (a case's own diagnosis by its text)."""
    named = [label for label, status in judgement.parts.items() if status != "fixed"]
    return (
        "expected: "
        + ", ".join(named)
        + (" (python -m harness findings)" if any(label.startswith("finding ") for label in named) else "")
    )


class CheckFailed(Exception):
    def __init__(self, result: CheckResult):
        self.result = result
        super().__init__("; ".join(result.problems))


class CheckItem(pytest.Item):
    """One generic check applied to one (case, profile)."""

    def __init__(self, *, case: Case, profile: str, check: Check, declared: Case | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.case = case
        self.profile = profile
        # the bracket of the node id: the profile, then a sweep variant's axes ("tiny,kv_heads=2")
        self.label = sweep.group_label(case, profile)
        # the (case, profile) whose pipeline this item reads: ``cases/nn.py::nn_linear[tiny]``
        self.group = node_ids.group_of(self.nodeid)
        self.declared = declared or case
        self.check = check
        self.duplicate_of: str | None = None
        # -m by check, family, profile and capability: `-m "rotary_parity and gemma4"`, `-m e2b_dims`.
        register_marker(self.config, case.family, f"every check of the {case.family} family's cases")
        register_marker(self.config, profile, f"every check at the {profile} profile")
        names = [check.name, case.family, profile] + [c for c in CAPABILITY_MARKERS if getattr(case, c) is not None]
        for name in dict.fromkeys(names):
            self.add_marker(name)
        axes = sweep.marker_kwargs(case, case.variant)
        if axes is not None:
            # -m 'sweep(kv_heads=2)' selects by axis value exactly (-k cannot parse '=' or ',').
            self.add_marker(pytest.mark.sweep(**axes))
        # A variant's record carries its label as the profile (as its node id does), so history
        # series, durations and reports keep variants apart; ``axes`` holds its values.
        self._record_base = {"case": case.name, "family": case.family, "profile": self.label, "check": check.name}
        if case.variant is not None:
            self._record_base["axes"] = case.variant.as_dict()

    def _record(self, **fields: Any) -> None:
        """Accumulate this item's record; ``pytest_runtest_makereport`` hangs it on the report
        (``report.wrapq_record``), which xdist carries to the controller. junit gets only a few
        scalar properties (``JUNIT_METRICS``), never the record."""
        with overhead("result_transport"):
            self.wrapq_record = jsonable(dict(getattr(self, "wrapq_record", None) or self._record_base, **fields))
            for name in JUNIT_METRICS:
                value = (fields.get("metrics") or {}).get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.user_properties.append((f"wrapq.{name}", value))

    def setup(self) -> None:
        reason = self.case.unavailable_reason()
        if reason:
            self._skip(f"case unavailable: {reason}")
        reason = self.case.not_applicable.get(self.check.name)
        if reason:
            reason = f"not applicable: {reason}"
        else:
            reason = self.check.applies(self.case) or self.check.applies_to_profile(self.case, self.profile)
        if reason:
            self._skip(reason)

    def _skip(self, reason: str) -> None:
        self._record(skip_reason=reason)
        compat.skip_at_item(reason)  # reported at the item (case file), not at this line

    def runtest(self) -> None:
        if self.duplicate_of:
            raise CaseDefinitionError(
                self.case.name, "name", f"duplicate case name, also defined in {self.duplicate_of}"
            )
        pipeline = state_of(self.config).pipelines.get(self.case, self.profile)
        pipeline.group = self.group
        if self.check.settings is not None:
            # What gated this item, in its record: reports and `python -m harness limits` read it.
            self._record(settings=dataclasses.asdict(pipeline.check_settings(self.check)))
        pipeline.guard_start()
        start = time.perf_counter()
        try:
            result = self.check.run(pipeline)
        except StageError as err:
            pipeline.guard_end()
            self._record(
                stage_error={"stage": err.stage, "type": err.error_type, "message": err.error_text},
                stage_timings=dict(pipeline.timings),
                check_seconds=time.perf_counter() - start,
            )
            # A stage that fails exactly as diagnosed (e.g. torch.export refusing a data-dependent
            # op) is an expected failure too; any other stage failure stays a failure.
            judgement = self._judge([stage_problem(err)])
            if judgement and judgement.expected:
                self._record(notes=[f"expected failure: {judgement.message}"])
                pytest.xfail(_xfail_line(judgement))
            similar = findings_data.looks_like(self.check.name, stage_problem(err))
            if similar:
                self._record(looks_like=list(similar))
            self._xfail_if_pre_existing([stage_problem(err)], {})
            raise
        mutated = pipeline.guard_end()
        if mutated:
            result.fail(f"check mutated shared pipeline artifacts: {', '.join(mutated[:5])}")
        self._set_aside_stale_allowlists(result)
        judgement = self._judge(result.problems)
        if judgement and judgement.verdict == "failed":
            result.problems.insert(0, judgement.message)
        elif judgement and judgement.verdict == "fixed":
            result.notes.append(judgement.message)
        elif judgement:
            result.notes.append(f"expected failure: {judgement.message}")
        elif result.problems:
            self._note_similar_findings(result)
        self._record(
            metrics=result.metrics,
            ungated=result.ungated,
            problems=result.problems,
            notes=result.notes,
            evidence=result.evidence,
            stage_timings=dict(pipeline.timings),
            check_seconds=time.perf_counter() - start,
        )
        if judgement and judgement.expected:
            # Exactly the diagnosed failure: expected. Its problem lines are in the record's notes;
            # the terminal gets one line (the findings section says the rest once per finding).
            pytest.xfail(_xfail_line(judgement))
        if not result.passed:
            self._xfail_if_pre_existing(result.problems, result.metrics)
            raise CheckFailed(result)

    def _xfail_if_pre_existing(self, problems: list[str], metrics: dict[str, Any]) -> None:
        """With --baseline: a failure the base run had the same way (no tracked metric worse) is
        pre-existing, reported as such and not blamed on the change (harness/golden/baseline.py)."""
        base = state_of(self.config).base_run
        if base is None:
            return
        tracked = [(key, m.better) for key in metrics for m in self.check.metrics if m.better and m.matches(key)]
        reason = pre_existing(base, self.nodeid, problems, metrics, tracked)
        if reason:
            earlier = (getattr(self, "wrapq_record", None) or {}).get("notes") or []
            self._record(baseline="pre-existing", notes=[reason, *earlier])
            pytest.xfail(reason)

    def _judge(self, problems: list[str]) -> Judgement | None:
        """The case's expectation for this check judged against ``problems`` (None: it declares none);
        strict on the tico the findings were recorded for (harness/tico_facts/findings_data.py)."""
        expectation = self.case.expected_failures_for(self.profile).get(self.check.name)
        if expectation is not None:
            expectation = findings_data.for_this_tico(expectation)
        if expectation is None:
            return None
        strict = state_of(self.config).findings_strict

        def judged(expected):
            return judge(expected, problems, strict=strict)

        judgement = judged(expectation)
        # A finding a newer tico brought that does not occur here was never here: not "fixed".
        kept = findings_data.without_absent_newer(expectation, judgement.parts)
        if kept is not expectation:
            if kept is None:
                return None
            judgement = judged(kept)
        self._record(findings={label.removeprefix("finding "): status for label, status in judgement.parts.items()})
        similar = {fid for line in judgement.unmatched for fid in findings_data.looks_like(self.check.name, line)}
        if similar:  # candidates, confirmed on the group by the run's findings summary
            self._record(looks_like=sorted(similar))
        return judgement

    def _set_aside_stale_allowlists(self, result: CheckResult) -> None:
        """On a tico other than the recorded one, an allow-list entry naming what that tico no longer
        has (a renamed observer, a fed one), or a golden's qparams of an observer it dropped or added, is
        reported as stale there, not as a failure."""
        if state_of(self.config).findings_strict:
            return
        stale = [p for p in result.problems if p.endswith(("(stale allowlist)", "(stale golden qparams)"))]
        if stale:
            result.problems[:] = [p for p in result.problems if p not in stale]
            result.notes += [f"stale on this tico: {line}" for line in stale]
            self._record(stale_allowlist=stale)

    def _note_similar_findings(self, result: CheckResult) -> None:
        """A failure on a case that declares no expectation: the known findings one of its lines resembles,
        kept in the record only; the run's findings summary names one only where the group shows all of its
        symptoms (harness/tico_facts/finding_status.confirm_suggestions), else the failure is a new problem."""
        similar = {fid for line in result.problems for fid in findings_data.looks_like(self.check.name, line)}
        if similar:
            self._record(looks_like=sorted(similar))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        err = excinfo.value
        if isinstance(err, pytest.xfail.Exception):
            # An expected failure's report is its judgement. pytest would otherwise format the
            # whole traceback of the xfail call with source (about 0.2 s an item, a third of a
            # warm run), only to replace it by the xfail reason.
            return str(err)
        if isinstance(err, CheckFailed):
            lines = [f"{self.check.name} failed for {self.case.name}[{self.label}]:"]
            lines += [f"  - {p}" for p in err.result.problems]
            return "\n".join(lines)
        if isinstance(err, StageError):
            # one traceback per failed (case, stage): the other items of the case point to it
            shown = state_of(self.config).stage_tracebacks_shown
            key = (self.group, err.stage)
            if key in shown:
                return f"{err}\n(traceback shown once, at {shown[key]})"
            shown[key] = self.nodeid
            return f"{err}\n\n{err.traceback_text}"
        if isinstance(err, CaseDefinitionError):
            return str(err)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.parent.name}::{self.name}"
