"""tico's diagnosed defects as data: ``findings/tico.toml``, one record per finding with a stable id.

A record holds a title, the cause (naming tico symbols), the wrappers it concerns and its problem
patterns per check (``any``: for every check without patterns of its own, e.g. a failed stage). A case
names the findings it expects by id: ``expect("rotate-half-two-qparams")``. A pattern may hold the
placeholder ``<probe>``, filled from the case's ``probes=`` (escaped: probe names are literal).

Patterns match a problem line's matchable form (``harness.model.expectations.matchable``): never a line
number, never an install path. ``[recorded]`` names the tico the findings were diagnosed on by its
source fingerprint (``harness.tico_facts.tico_identity``): there an expectation that no longer holds is an
error; on any other tico it is reported fixed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.model.expectations import Expected, Part, matchable
from harness.tico_facts.tico_identity import identity

FINDINGS_FILE = Path(__file__).resolve().parents[2] / "findings" / "tico.toml"
ANY_CHECK = "any"
PROBE = "<probe>"
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# What a pattern must not name: a line number after a source file, or an install location.
FORBIDDEN_IN_PATTERNS = (
    (re.compile(r"\.py\\?:\\?d|\.py:\d|\.py:\[|, line \\?d|, line \d"), "a line number"),
    (re.compile(r"site-packages|dist-packages|/home/|/usr/|/tmp/|^\^?/"), "an install path"),
)


class FindingsError(ValueError):
    """The findings data or a reference to it is malformed."""


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    cause: str
    symbols: tuple[str, ...]
    patterns: Mapping[str, tuple[str, ...]]
    # the tico this finding was first diagnosed on, where that is not [recorded] (a defect a newer
    # tico brought): the recorded tico does not show it, so expectations of it hold elsewhere only
    since: str | None = None

    def patterns_for(self, check: str) -> tuple[str, ...]:
        """The check's own patterns, else the ones for any check (e.g. a stage every check meets)."""
        return tuple(self.patterns.get(check) or self.patterns.get(ANY_CHECK, ()))

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(sorted(self.patterns))


@dataclass(frozen=True)
class ApiChange:
    """A change of tico's API that a case must follow (not a defect): which failures it explains
    (``patterns``, matched against any line of a failed item) and what the case must do."""

    id: str
    title: str
    since: str
    follow: str
    symbols: tuple[str, ...]
    patterns: tuple[str, ...]
    # fnmatch globs over 'case[profile]::check' the change explains failures of; empty: any item
    # (a symptom as generic as a moved golden needs the cases named)
    where: tuple[str, ...] = ()


@dataclass(frozen=True)
class Registry:
    recorded_version: str
    recorded_sources: str
    findings: Mapping[str, Finding]
    api_changes: Mapping[str, ApiChange] = dataclasses.field(default_factory=dict)

    def get(self, finding_id: str) -> Finding:
        try:
            return self.findings[finding_id]
        except KeyError:
            raise FindingsError(
                f"unknown finding {finding_id!r} (findings/tico.toml has "
                f"{len(self.findings)}: python -m harness findings)"
            ) from None


def pattern_flaw(pattern: str) -> str | None:
    """What a pattern names that does not survive a refactor or another install, or None."""
    for regex, what in FORBIDDEN_IN_PATTERNS:
        if regex.search(pattern):
            return what
    return None


def parse(data: Mapping[str, Any], where: str = "findings") -> Registry:
    recorded = data.get("recorded") or {}
    if not isinstance(recorded.get("version"), str) or not isinstance(recorded.get("source_sha256"), str):
        raise FindingsError(f"{where}: [recorded] needs version and source_sha256")
    findings: dict[str, Finding] = {}
    for i, raw in enumerate(data.get("finding") or []):
        fid = raw.get("id")
        at = f"{where}: finding[{i}] {fid!r}"
        if not isinstance(fid, str) or not _ID.match(fid):
            raise FindingsError(f"{at}: id must be lower-case words joined by '-'")
        if fid in findings:
            raise FindingsError(f"{at}: duplicate id")
        for key in ("title", "cause"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise FindingsError(f"{at}: {key} must be a non-empty string")
        patterns = raw.get("patterns")
        if not isinstance(patterns, dict) or not patterns:
            raise FindingsError(f"{at}: patterns must map check names (or 'any') to lists of regular expressions")
        checked = {check: _checked_patterns(at, items, f"patterns.{check}") for check, items in patterns.items()}
        since = raw.get("since")
        if since is not None and (not isinstance(since, str) or not since.strip()):
            raise FindingsError(f"{at}: since must name the tico version the finding was diagnosed on")
        findings[fid] = Finding(
            fid, raw["title"].strip(), " ".join(raw["cause"].split()), tuple(raw.get("symbols") or ()), checked, since
        )
    return Registry(
        recorded["version"],
        recorded["source_sha256"],
        findings,
        _parse_api_changes(data.get("api_change") or [], where, set(findings)),
    )


def _checked_patterns(at: str, items: Any, what: str) -> tuple[str, ...]:
    if not isinstance(items, list) or not items or not all(isinstance(p, str) and p for p in items):
        raise FindingsError(f"{at}: {what} must be a non-empty list of strings")
    for pattern in items:
        flaw = pattern_flaw(pattern)
        if flaw:
            raise FindingsError(
                f"{at}: pattern {pattern!r} names {flaw}; match observer and module "
                f"paths, op kinds, class and function names instead"
            )
        try:
            re.compile(pattern.replace(PROBE, "x"))
        except re.error as exc:
            raise FindingsError(f"{at}: bad regular expression {pattern!r}: {exc}") from None
    return tuple(items)


def _parse_api_changes(raws: list, where: str, finding_ids: set[str]) -> dict[str, ApiChange]:
    changes: dict[str, ApiChange] = {}
    for i, raw in enumerate(raws):
        cid = raw.get("id")
        at = f"{where}: api_change[{i}] {cid!r}"
        if not isinstance(cid, str) or not _ID.match(cid):
            raise FindingsError(f"{at}: id must be lower-case words joined by '-'")
        if cid in changes or cid in finding_ids:
            raise FindingsError(f"{at}: duplicate id")
        for key in ("title", "since", "follow"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise FindingsError(f"{at}: {key} must be a non-empty string")
        patterns = _checked_patterns(at, raw.get("patterns"), "patterns")
        if any(PROBE in p for p in patterns):
            raise FindingsError(f"{at}: an API change's patterns take no {PROBE}")
        where = raw.get("where") or []
        if not isinstance(where, list) or not all(isinstance(w, str) and w for w in where):
            raise FindingsError(f"{at}: where must be a list of 'case[profile]::check' globs")
        changes[cid] = ApiChange(
            cid,
            raw["title"].strip(),
            raw["since"].strip(),
            " ".join(raw["follow"].split()),
            tuple(raw.get("symbols") or ()),
            patterns,
            tuple(where),
        )
    return changes


@functools.lru_cache(maxsize=4)
def registry(path: Path = FINDINGS_FILE) -> Registry:
    try:
        return parse(tomllib.loads(path.read_text()), where=str(path))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FindingsError(f"cannot read {path}: {exc}") from None


def recorded_here() -> bool:
    """Whether the tico this process imports is the one the findings were recorded on (same sources)."""
    return identity().get("source_sha256") == registry().recorded_sources


def for_this_tico(expectation: Expected) -> Expected | None:
    """``expectation`` without the findings a newer tico brought (``since``) when this is the tico
    the findings were recorded on, where they cannot occur; None when nothing is left."""
    if not recorded_here():
        return expectation
    reg = registry()
    parts = tuple(
        part
        for part in expectation.parts
        if part.finding is None or part.finding not in reg.findings or not reg.findings[part.finding].since
    )
    return Expected(parts=parts) if parts else None


def without_absent_newer(expectation: Expected, statuses: Mapping[str, str]) -> Expected | None:
    """``expectation`` without the parts of findings a newer tico brought (``since``) that do not
    occur on this run (``statuses`` by part label): on a tico without them they are neither open nor
    fixed. The same object when nothing is dropped; None when nothing is left."""
    reg = registry()
    absent = {
        part.label
        for part in expectation.parts
        if part.finding in reg.findings and reg.findings[part.finding].since and statuses.get(part.label) == "fixed"
    }
    if not absent:
        return expectation
    parts = tuple(part for part in expectation.parts if part.label not in absent)
    return Expected(parts=parts) if parts else None


def _expand(patterns: Iterable[str], probes: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for pattern in patterns:
        if PROBE in pattern:
            if not probes:
                raise FindingsError(f"pattern {pattern!r} needs probes=(...)")
            out += [pattern.replace(PROBE, re.escape(probe)) for probe in probes]
        else:
            out.append(pattern)
    return tuple(out)


def expect(*ids: str, check: str | None = None, probes: tuple[str, ...] = ()) -> Expected:
    """The expectation that ``ids`` occur on one check. ``check`` picks the patterns where a finding
    has patterns for several checks."""
    if not ids:
        raise FindingsError("expect() needs at least one finding id")
    reg = registry()
    parts = []
    for fid in ids:
        finding = reg.get(fid)
        own = [c for c in finding.patterns if c != ANY_CHECK]
        chosen = check
        if chosen is None and len(own) > 1:
            raise FindingsError(f"finding {fid} has patterns for {own}: say check=...")
        if chosen is None:
            chosen = own[0] if own else ANY_CHECK
        patterns = finding.patterns_for(chosen)
        if not patterns:
            raise FindingsError(f"finding {fid} has no patterns for check {chosen!r} (it has {finding.checks})")
        parts.append(Part(finding.title, _expand(patterns, probes), fid))
    return Expected(parts=tuple(parts))


def expect_on(checks: Iterable[str], *ids: str, probes: tuple[str, ...] = ()) -> dict[str, Expected]:
    """``{check: expect(*ids, check=check)}`` for each check: one finding seen by several checks."""
    return {check: expect(*ids, check=check, probes=probes) for check in checks}


def definition_errors(check: str, expectation: Expected) -> list[str]:
    """Why ``expectation`` cannot stand under ``check`` (a finding it names has no patterns there)."""
    reg = registry()
    errors = []
    for fid in expectation.findings:
        if fid not in reg.findings:
            errors.append(f"names unknown finding {fid!r}")
        elif not reg.findings[fid].patterns_for(check):
            errors.append(
                f"names finding {fid} under {check}, where it has no patterns "
                f"(it has {', '.join(reg.findings[fid].checks)})"
            )
    return errors


@functools.lru_cache(maxsize=1)
def _generic_by_finding() -> dict[str, dict[str, tuple[re.Pattern, ...]]]:
    """Each finding's patterns by check, with ``<probe>`` matching any probe name."""
    return {
        f.id: {
            check: tuple(re.compile(p.replace(PROBE, r"[^\]]+")) for p in found) for check, found in f.patterns.items()
        }
        for f in registry().findings.values()
    }


def _for_check(patterns: Mapping[str, tuple[re.Pattern, ...]], check: str) -> tuple[re.Pattern, ...]:
    """The check's own patterns, else the ones for any check (``Finding.patterns_for``)."""
    return patterns.get(check) or patterns.get(ANY_CHECK, ())


def looks_like(check: str, line: str) -> tuple[str, ...]:
    """The findings one of whose patterns for ``check`` matches ``line`` (its matchable form): candidates,
    until their other symptoms are found too (``shows_every_symptom``)."""
    text = matchable(line)
    return tuple(
        fid
        for fid, by_check in _generic_by_finding().items()
        if any(p.search(text) for p in _for_check(by_check, check))
    )


def shows_every_symptom(fid: str, lines_by_check: Mapping[str, Iterable[str]]) -> bool:
    """Whether a (case, profile) group shows finding ``fid`` whole: for each check the finding has its own
    patterns for, the group's item of that check -- where it ran -- said a line one of them matches. A
    failure one generic pattern matches (output steps over a limit) is no diagnosis while the finding's
    distinctive symptoms (an observer never fed, a node without qparams) are absent."""
    by_check = _generic_by_finding().get(fid, {})
    for check, lines in lines_by_check.items():
        found = by_check.get(check)
        if found and not any(p.search(matchable(line)) for p in found for line in lines):
            return False
    return True


@functools.lru_cache(maxsize=1)
def _api_patterns() -> tuple[tuple[str, tuple[str, ...], tuple[re.Pattern, ...]], ...]:
    return tuple((c.id, c.where, tuple(re.compile(p) for p in c.patterns)) for c in registry().api_changes.values())


def api_change_of(lines: Iterable[str], where: str = "") -> str | None:
    """The API change whose pattern matches one of a failed item's lines (matchable form), or None.
    ``where`` ('case[profile]::check') is held against a change's ``where`` globs."""
    texts = [matchable(line) for line in lines if line]
    for cid, globs, patterns in _api_patterns():
        if globs and not any(fnmatch.fnmatchcase(where, g) for g in globs):
            continue
        if any(p.search(text) for p in patterns for text in texts):
            return cid
    return None
