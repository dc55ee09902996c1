"""Regression policies of the nightly dashboard: how far a tracked metric may move before it is
flagged (issue #21).

Three layers, the later winning field by field:

1. the dashboard's ``--margin`` (relative), for metrics that declare no margin;
2. the metric's declaration, ``Metric(regression=RegressionPolicy(margin=..., noise_k=...,
   abs_floor=...))`` in the check module (harness/checks/base.py), stored with every value in the
   history database, the newest row of a series governing it;
3. ``regression_policy.toml`` at the repository root (``--policy FILE``, ``.toml`` or ``.json``),
   reviewed like code: ``[[policy]]`` entries naming case, profile, check, metric and testbed
   (fnmatch patterns, each ``*`` when omitted) with one or more of ``margin``, ``noise_k``,
   ``abs_floor`` and a ``reason``. Entries apply in file order; a later matching entry overrides
   the fields it sets. ``noise_k = 0`` turns the noise band off.

A per-case policy lives in the file rather than in ``Case.settings`` (whose keys are the checks'
settings fields, validated strictly): the history is judged after the fact from the database, so
a file read at dashboard time re-judges every night already recorded, and changing a policy
needs no new run.

The allowed worsening is ``max(margin * |baseline| + abs_floor, noise_k * noise)`` (see
``RegressionPolicy``).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report.reviewed_file import check_fields, entry_tables, read_document

DEFAULT_FILE = "regression_policy.toml"
KNOBS = ("margin", "noise_k", "abs_floor")
_PATTERNS = ("case", "profile", "check", "metric", "testbed")
_FIELDS = set(_PATTERNS) | set(KNOBS) | {"reason"}
DEFAULT = {"margin": None, "noise_k": 3.0, "abs_floor": 1e-9}  # RegressionPolicy()'s defaults


class PolicyError(ValueError):
    """A policy file that cannot be used as it is (the message names entry and field)."""


@dataclass(frozen=True)
class PolicyEntry:
    index: int
    reason: str
    values: tuple[tuple[str, float], ...]  # (knob, value) it sets
    case: str = "*"
    profile: str = "*"
    check: str = "*"
    metric: str = "*"
    testbed: str = "*"

    def matches(self, case: str, profile: str, check: str, metric: str, testbed: str | None) -> bool:
        return all(
            fnmatch.fnmatchcase(value or "", pattern)
            for value, pattern in (
                (case, self.case),
                (profile, self.profile),
                (check, self.check),
                (metric, self.metric),
                (testbed, self.testbed),
            )
        )

    @property
    def label(self) -> str:
        return f"policy entry {self.index}"


def _entry(index: int, raw: Any, where: str) -> PolicyEntry:
    label = f"{where}: entry {index}"
    check_fields(raw, _FIELDS, label, PolicyError)
    for name in _PATTERNS:
        if name in raw and (not isinstance(raw[name], str) or not raw[name].strip()):
            raise PolicyError(f"{label}: '{name}' must be a non-empty string (an fnmatch pattern; omit it for all)")
    if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
        raise PolicyError(f"{label}: 'reason' is required (a non-empty string)")
    values = []
    for name in KNOBS:
        if name not in raw:
            continue
        value = raw[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise PolicyError(f"{label}: '{name}' must be a finite number >= 0, got {value!r}")
        values.append((name, float(value)))
    if not values:
        raise PolicyError(f"{label}: set at least one of {', '.join(KNOBS)}")
    return PolicyEntry(
        index=index,
        reason=raw["reason"].strip(),
        values=tuple(values),
        **{name: raw[name] for name in _PATTERNS if name in raw},
    )


def parse_policies(data: Any, where: str) -> list[PolicyEntry]:
    entries = entry_tables(data, "policy", where, PolicyError)
    return [_entry(i, raw, where) for i, raw in enumerate(entries, start=1)]


def load_policies(path: Path) -> list[PolicyEntry]:
    return parse_policies(read_document(path, "policy", PolicyError), str(path))


def resolve(
    declared: dict[str, Any] | None,
    entries: list[PolicyEntry],
    default_margin: float,
    key: tuple[str | None, str, str, str, str],
) -> dict[str, Any]:
    """The effective policy of one series ``(testbed, case, profile, check, metric)``:
    margin, noise_k, abs_floor, and where each came from (``sources``)."""
    testbed, case, profile, check, metric = key
    out: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in KNOBS:
        value = (declared or {}).get(name, DEFAULT[name]) if declared is not None else DEFAULT[name]
        out[name], sources[name] = value, "metric"
    if out["margin"] is None:
        out["margin"], sources["margin"] = float(default_margin), "--margin"
    if out["noise_k"] is None:
        out["noise_k"] = 0.0
    for entry in entries:
        if entry.matches(case, profile, check, metric, testbed):
            for name, value in entry.values:
                out[name], sources[name] = value, entry.label
    out["sources"] = sources
    return out


def describe(policy: dict[str, Any]) -> str:
    """``margin 10% (--margin), 3 x noise (metric)`` -- what judged a series, for hover titles."""
    src = policy.get("sources") or {}
    parts = [f"margin {policy['margin']:.3g} ({src.get('margin', '?')})"]
    parts.append(
        f"{policy['noise_k']:.3g} x noise ({src.get('noise_k', '?')})"
        if policy["noise_k"]
        else f"no noise band ({src.get('noise_k', '?')})"
    )
    if src.get("abs_floor") not in (None, "metric") or policy["abs_floor"] != DEFAULT["abs_floor"]:
        parts.append(f"floor {policy['abs_floor']:.3g} ({src.get('abs_floor', '?')})")
    return ", ".join(parts)
