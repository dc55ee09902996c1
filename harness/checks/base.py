"""What a check is: a function of a pipeline returning a CheckResult, plus what it owns --
when it applies, its settings (with defaults a case overrides by check name), the metrics it
reports (name, direction, unit, the setting that gates it) and its report fragment. The
summary, the HTML report, the history and ``python -m harness limits`` read these
declarations from the registry (or from results.json, which carries them), never a list of
check or metric names of their own."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.model.case import Case


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
    # metrics measured but gated by no limit (the case sets none): shown as "ungated", not only noted
    ungated: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def fail(self, message: str) -> None:
        self.problems.append(message)

    def gate(self, label: str, value: float, limit: float | None, *, upper: bool = True) -> None:
        """Compare ``value`` against ``limit`` (None = not gated, recorded as a note)."""
        if limit is None:
            self.notes.append(f"{label} not gated (no threshold set)")
            self.ungated.append(label)
            return
        bad = math.isnan(value) or (value > limit if upper else value < limit)
        if bad:
            relation = "exceeds" if upper else "is below"
            self.fail(f"{label} {value:.6g} {relation} threshold {limit:.6g}")


@dataclass(frozen=True)
class RegressionPolicy:
    """How the nightly dashboard judges a tracked metric's latest value against its baseline
    (the median of the previous ``--window`` runs on the same testbed). The allowed worsening is
    ``max(margin * |baseline| + abs_floor, noise_k * noise)``, where ``noise`` is the series' own
    night-to-night spread (1.4826 x the median absolute deviation over the window) when it is
    measurable (at least 3 runs and above ``NOISE_FLOOR_REL`` of the baseline); a deterministic
    series has none and is judged by the margin alone. ``margin`` None means the dashboard's
    ``--margin``; ``noise_k`` None turns the noise band off. A policy file
    (``regression_policy.toml``) overrides these per case, profile, check, metric or testbed."""

    margin: float | None = None
    noise_k: float | None = 3.0
    abs_floor: float = 1e-9

    def __post_init__(self) -> None:
        for name in ("margin", "noise_k", "abs_floor"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or not math.isfinite(value)
            ):
                raise ValueError(f"regression policy: {name} must be a finite number >= 0, got {value!r}")

    def describe(self) -> dict[str, Any]:
        return {"margin": self.margin, "noise_k": self.noise_k, "abs_floor": self.abs_floor}


@dataclass(frozen=True)
class Metric:
    """A number a check reports in ``CheckResult.metrics``.

    ``name`` may hold ``*`` (fnmatch) for families of keys, e.g. one per extra output; keys a
    check adds per evaluation sample (``peir[padded]``) match their base name. ``better`` is
    "lower" or "higher" (the history tracks the metric and flags a move the wrong way) or None
    (information, not tracked). ``limit`` names the check's settings field that gates it, so
    ``python -m harness limits`` can propose it. ``headline`` metrics get a column in the
    terminal summary and the report overview. ``floor`` is the smallest limit worth stating
    (e.g. one rounding flip of the Circle runtime); ``limit_fallback`` names the settings field
    that gates the metric while ``limit`` is None (extra outputs fall back to output 0's limit).
    ``counts`` marks a metric that measures a whole number of levels (the max Circle steps: each
    one a rounding flip) up to float error: a proposed limit is the measured count, not the count
    with headroom, since 1.25 x 2 flips gates exactly what 2 does.
    ``regression`` is how the nightly dashboard judges a move of a tracked metric (see
    ``RegressionPolicy``; the default: the dashboard's margin, widened to 3 x the series' noise)."""

    name: str
    better: str | None = "lower"
    unit: str = ""
    label: str = ""
    limit: str | None = None
    headline: bool = False
    floor: float | None = None
    limit_fallback: str | None = None
    counts: bool = False
    regression: RegressionPolicy = RegressionPolicy()

    def __post_init__(self) -> None:
        if not isinstance(self.regression, RegressionPolicy):
            raise TypeError(f"metric {self.name!r}: regression must be a RegressionPolicy, got {self.regression!r}")
        if self.better not in ("lower", "higher", None):
            raise ValueError(f"metric {self.name!r}: better must be 'lower', 'higher' or None, got {self.better!r}")

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key.split("[")[0], self.name)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "better": self.better,
            "unit": self.unit,
            "label": self.label or self.name,
            "limit": self.limit,
            "headline": self.headline,
            "floor": self.floor,
            "limit_fallback": self.limit_fallback,
            "counts": self.counts,
            "regression": self.regression.describe(),
        }


@dataclass(frozen=True)
class Check:
    """A generic check. ``applies(case)`` returns None when applicable, else the reason.

    ``settings`` is a frozen dataclass whose defaults hold for every case; a case overrides
    fields by check name (``Case(settings={"<check>": {"field": value}})``) and per profile
    (``ProfileLimits``), and the check reads the merged instance with ``pipeline.settings(CHECK)``.
    ``report`` is a jinja2 fragment rendered (autoescaped) in the HTML report under the check's
    row, with ``rec`` (its record in results.json) in scope."""

    name: str
    run: Callable[[Any], CheckResult]
    applies: Callable[[Case], str | None] = lambda case: None
    description: str = ""
    # like ``applies`` but for one profile of the case (e.g. goldens are kept for some only)
    applies_to_profile: Callable[[Case, str], str | None] = lambda case, profile: None
    settings: type | None = None
    metrics: tuple[Metric, ...] = ()
    report: str | None = None

    def __post_init__(self) -> None:
        if self.settings is not None and not (
            dataclasses.is_dataclass(self.settings) and isinstance(self.settings, type)
        ):
            raise TypeError(f"check {self.name!r}: settings must be a dataclass type, got {self.settings!r}")
        if self.settings is not None:
            missing = [
                f.name
                for f in dataclasses.fields(self.settings)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ]
            if missing:
                raise TypeError(f"check {self.name!r}: every settings field needs a default ({', '.join(missing)})")
        names = {f.name for f in dataclasses.fields(self.settings)} if self.settings is not None else set()
        for metric in self.metrics:
            for field_name in (metric.limit, metric.limit_fallback):
                if field_name is not None and field_name not in names:
                    raise TypeError(
                        f"check {self.name!r}: metric {metric.name!r} is gated by {field_name!r}, "
                        f"which is no field of its settings"
                    )

    def describe(self) -> dict[str, Any]:
        """What results.json carries about the check, so reports need no registry."""
        return {"description": self.description, "metrics": [m.describe() for m in self.metrics], "report": self.report}


# A report fragment for checks whose evidence is best read as it is.
EVIDENCE_DETAILS = (
    "{% if rec.get('evidence') %}<details><summary>evidence</summary><pre>{{ rec.evidence | tojson_pretty }}"
    "</pre></details>{% endif %}"
)


def requires_capability(capability: str) -> Callable[[Case], str | None]:
    def applies(case: Case) -> str | None:
        if getattr(case, capability) is None:
            return f"not applicable: case {case.name!r} declares no {capability} capability"
        return None

    return applies
