"""Precise expected failures: an expectation names the problems it covers, not a whole check.

A case declares ``expected_failures={"mask_quant": Expected(reason, problems=(regex, ...))}``.
After the check runs, its problem lines are judged against the patterns:

* every problem matches a pattern and every pattern matches a problem -> expected failure
  (xfail), reported with the diagnosis *and the problem lines of this run* (their numbers are
  measured now, never typed into the reason);
* a problem no pattern matches -> the item fails: a new defect is never swallowed by an old
  expectation;
* a pattern no problem matches -> the item fails (strict): the diagnosed problem is gone or
  changed, so the expectation must be updated or removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


# Openings of the judgement messages that other modules recognise (drift labels them).
NOW_PASSES = "expected failure no longer occurs"
CHANGED = "expected problem(s) no longer occur"
UNEXPECTED = "unexpected problem(s) beside the expected failure"


@dataclass(frozen=True)
class Expected:
    """A diagnosed, expected failure of one check. ``reason`` states the diagnosis (no measured
    numbers: those come from the run); ``problems`` are regular expressions (``re.search``), each
    of which must match at least one of the check's problem lines."""

    reason: str
    problems: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("Expected.reason must be a non-empty diagnosis")
        if not isinstance(self.problems, tuple) or not self.problems or not all(
            isinstance(p, str) and p for p in self.problems
        ):
            raise ValueError("Expected.problems must be a non-empty tuple of regular expressions")
        for pattern in self.problems:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"Expected.problems: bad regular expression {pattern!r}: {exc}") from exc


@dataclass(frozen=True)
class Judgement:
    """``expected``: True when the failure is exactly the diagnosed one; ``message`` says why."""

    expected: bool
    message: str


def judge(expectation: Expected, problems: list[str]) -> Judgement:
    unmatched = [p for p in problems if not any(re.search(pattern, p) for pattern in expectation.problems)]
    unmet = [pattern for pattern in expectation.problems if not any(re.search(pattern, p) for p in problems)]
    if unmatched:
        return Judgement(False, f"{UNEXPECTED} ({expectation.reason}): " + " | ".join(unmatched))
    if unmet:
        if not problems:
            return Judgement(False, f"{NOW_PASSES}: the check passed; remove or update the "
                                    f"expectation ({expectation.reason})")
        return Judgement(False, f"{CHANGED}: " + " | ".join(unmet)
                         + "; the check now reports: " + " | ".join(problems) + f" ({expectation.reason})")
    return Judgement(True, f"{expectation.reason} -- measured now: " + " | ".join(problems))
