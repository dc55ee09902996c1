"""What a check is: a function of a pipeline returning a CheckResult, plus when it applies."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.case import Case


@dataclass
class CheckResult:
    """Outcome of one check on one (case, profile).

    ``metrics`` are numbers for tables and trends; ``evidence`` is structured detail for the
    report (which sample, which tensor, where it diverged). ``problems`` are the human-readable
    reasons for failure; a result with problems has failed.
    """

    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def fail(self, message: str) -> None:
        self.problems.append(message)

    def gate(self, label: str, value: float, limit: float | None, *, upper: bool = True) -> None:
        """Compare ``value`` against ``limit`` (None = not gated, recorded as a note)."""
        if limit is None:
            self.notes.append(f"{label} not gated (no threshold set)")
            return
        bad = math.isnan(value) or (value > limit if upper else value < limit)
        if bad:
            relation = "exceeds" if upper else "is below"
            self.fail(f"{label} {value:.6g} {relation} threshold {limit:.6g}")


@dataclass(frozen=True)
class Check:
    """A generic check. ``applies(case)`` returns None when applicable, else the reason."""

    name: str
    run: Callable[[Any], CheckResult]
    applies: Callable[[Case], str | None] = lambda case: None
    description: str = ""
    # like ``applies`` but for one profile of the case (e.g. goldens are kept for some only)
    applies_to_profile: Callable[[Case, str], str | None] = lambda case, profile: None


def requires_capability(capability: str) -> Callable[[Case], str | None]:
    def applies(case: Case) -> str | None:
        if getattr(case, capability) is None:
            return f"not applicable: case {case.name!r} declares no {capability} capability"
        return None

    return applies
