"""Precise expected failures: an expectation names the problems it covers, not a whole check.

A case declares ``expected_failures={"mask_quant": expect("mask-fill-clamped", probes=(...))}``
(a finding of tico, by id: ``harness/tico_facts/findings_data.py``) or, for a wrapper author's own diagnosis,
``Expected(reason, problems=(regex, ...))``. Expectations add up with ``+``; each part keeps its
finding id, so one part can be fixed while another still occurs.

After the check runs, its problem lines are judged against the patterns. Problem lines are matched
in their *matchable* form: a source location keeps its package-relative path and loses its line
number and install prefix (``/x/site-packages/tico/a.py:251`` -> ``tico/a.py``), so moving code or
installing tico elsewhere never changes a verdict.

* every problem matches a pattern and every pattern matches a problem -> expected failure (xfail);
* a problem no pattern matches -> the item fails: a new defect is never swallowed by an old one;
* a part none of whose patterns match any more: on the tico the findings were recorded for, the
  item fails (strict: update the expectation); on any other tico it is reported *fixed*, not red.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Openings of the judgement messages that other modules recognise (drift labels them).
NOW_PASSES = "expected failure no longer occurs"
CHANGED = "expected problem(s) no longer occur"
UNEXPECTED = "unexpected problem(s) beside the expected failure"

# An absolute or relative path ending in a tico source file, with an optional ':line' or ':a-b'.
_TICO_LOCATION = re.compile(r"(?:[^\s\"'(),]*?/)?(?<![\w.-])(tico/[\w./-]*?\.py)(?::\d+(?:-\d+)?)?")
_PY_LINE = re.compile(r"(\.py)(?::\d+(?:-\d+)?|(\"?), line \d+)")


def matchable(line: str) -> str:
    """``line`` without install prefixes and line numbers: what expectation patterns match."""
    return _PY_LINE.sub(lambda m: m.group(1) + (m.group(2) or ""), _TICO_LOCATION.sub(r"\1", line))


@dataclass(frozen=True)
class Part:
    """One diagnosis inside an expectation: a tico finding (``finding`` is its id) or a case's own."""

    reason: str
    problems: tuple[str, ...]
    finding: str | None = None

    @property
    def label(self) -> str:
        return f"finding {self.finding}" if self.finding else f"the case's own diagnosis ({self.reason[:60]})"


class Expected:
    """A diagnosed, expected failure of one check: one or more parts. ``Expected(reason,
    problems=(regex, ...))`` is a single part; ``reason`` states the diagnosis (no measured numbers:
    those come from the run)."""

    __slots__ = ("parts",)

    def __init__(
        self,
        reason: str | None = None,
        problems: tuple[str, ...] = (),
        *,
        finding: str | None = None,
        parts: tuple[Part, ...] | None = None,
    ):
        if parts is None:
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError("Expected.reason must be a non-empty diagnosis")
            parts = (Part(reason, problems, finding),)
        for part in parts:
            _validate(part)
        object.__setattr__(self, "parts", tuple(parts))

    def __setattr__(self, name, value):
        raise AttributeError("Expected is immutable")

    def __add__(self, other: "Expected") -> "Expected":
        if not isinstance(other, Expected):
            return NotImplemented
        return Expected(parts=self.parts + other.parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expected) and other.parts == self.parts

    def __hash__(self) -> int:
        return hash(self.parts)

    def __repr__(self) -> str:
        return f"Expected({', '.join(p.finding or repr(p.reason[:40]) for p in self.parts)})"

    @property
    def reason(self) -> str:
        return "; ".join(part.reason for part in self.parts)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(pattern for part in self.parts for pattern in part.problems)

    @property
    def findings(self) -> tuple[str, ...]:
        return tuple(part.finding for part in self.parts if part.finding)


def _validate(part: Part) -> None:
    if not isinstance(part.reason, str) or not part.reason.strip():
        raise ValueError("Expected.reason must be a non-empty diagnosis")
    if (
        not isinstance(part.problems, tuple)
        or not part.problems
        or not all(isinstance(p, str) and p for p in part.problems)
    ):
        raise ValueError("Expected.problems must be a non-empty tuple of regular expressions")
    for pattern in part.problems:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"Expected.problems: bad regular expression {pattern!r}: {exc}") from exc


@dataclass(frozen=True)
class Judgement:
    """``verdict``: 'expected' (xfail), 'failed' or 'fixed' (every part gone on a tico under review:
    the item passes). ``parts``: finding label -> 'occurs', 'fixed' or 'changed' (some of its
    patterns gone); ``unmatched``: problem lines no pattern matches."""

    verdict: str
    message: str
    parts: dict[str, str] = field(default_factory=dict)
    unmatched: tuple[str, ...] = ()

    @property
    def expected(self) -> bool:
        return self.verdict == "expected"


def _part_status(part: Part, lines: list[str]) -> tuple[str, list[str]]:
    unmet = [pattern for pattern in part.problems if not any(re.search(pattern, line) for line in lines)]
    if not unmet:
        return "occurs", unmet
    return ("fixed" if len(unmet) == len(part.problems) else "changed"), unmet


def judge(expectation: Expected, problems: list[str], *, strict: bool = True) -> Judgement:
    """``strict``: the run is on the tico the expectation was recorded for. A line no pattern matches
    fails the item (``Judgement.unmatched``)."""
    lines = [matchable(p) for p in problems]
    unmatched = tuple(
        p for p, line in zip(problems, lines) if not any(re.search(pattern, line) for pattern in expectation.problems)
    )
    statuses = {}
    unmet_all: list[str] = []
    for part in expectation.parts:
        status, unmet = _part_status(part, lines)
        statuses[part.label] = status
        unmet_all += unmet
    if unmatched:
        message = f"{UNEXPECTED} ({expectation.reason}): " + " | ".join(unmatched)
        return Judgement("failed", message, statuses, unmatched)
    gone = [label for label, status in statuses.items() if status != "occurs"]
    if gone and strict:
        if not problems:
            return Judgement(
                "failed",
                f"{NOW_PASSES}: the check passed; remove or update the expectation ({expectation.reason})",
                statuses,
            )
        return Judgement(
            "failed",
            f"{CHANGED}: "
            + " | ".join(unmet_all)
            + "; the check now reports: "
            + " | ".join(problems)
            + f" ({expectation.reason})",
            statuses,
        )
    fixed_note = ""
    if gone:
        fixed_note = " -- no longer occurs on this tico: " + ", ".join(
            f"{label} ({'partly' if statuses[label] == 'changed' else 'whole'})" for label in gone
        )
    if all(status == "fixed" for status in statuses.values()):
        # No pattern matches, and (no line being unmatched) no problem is left: the check passes.
        return Judgement(
            "fixed", f"fixed on this tico: {', '.join(gone)}; remove it from the case's expected_failures", statuses
        )
    return Judgement(
        "expected", f"{expectation.reason} -- measured now: " + " | ".join(problems) + fixed_note, statuses
    )
