"""Run one generic check on a fresh pipeline, as the plugin does, without pytest collection."""

from __future__ import annotations

from harness.case import Case
from harness.checks import all_checks
from harness.checks.base import CheckResult
from harness.pipeline import Pipeline

CHECKS = {check.name: check for check in all_checks()}


def run_check(case: Case, check_name: str, profile: str = "tiny") -> CheckResult:
    pipeline = Pipeline(case, profile)
    check = CHECKS[check_name]
    assert check.applies(case) is None, f"{check_name} does not apply to {case.name}"
    return check.run(pipeline)


def problems_text(result: CheckResult) -> str:
    return "\n".join(result.problems)
