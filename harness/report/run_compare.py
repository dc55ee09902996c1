"""What changed between two runs of the matrix (a pull request's head against its base): per
item, verdict changes first -- passed -> failed, new failures, fixed, new and removed items,
xfail <-> fail, an item red on both sides whose head has a problem the base does not -- then moves
of the metrics the checks declare with a direction
(``Metric(better=...)``, carried in ``run.checks``) beyond a relative margin, each with the
command that reruns the item. Two runs on different pinned stacks (``run.versions``) are not
compared: their numbers differ for reasons no commit made.

``python -m harness compare BASE.json HEAD.json`` (harness/commands/compare.py) is the
command line; this module reads, compares and renders.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.golden.baseline import signature
from harness.records import node_ids, rerun
from harness.records.results import problem_lines, same_release
from harness.tico_facts.drift import headline

BAD = ("failed", "error", "crashed", "not_run")
RAN = ("passed", "xfailed") + BAD
ABS_FLOOR = 1e-9
WORSE, BETTER, CHANGED = "worse", "better", "changed"
_KIND_ORDER = {WORSE: 0, BETTER: 1, CHANGED: 2}


class CompareError(ValueError):
    """Input that cannot be compared: a missing or corrupt file, or runs on different stacks."""


# -- input --------------------------------------------------------------------------------------
def load_results(path: Path, role: str = "results") -> dict[str, Any]:
    """A results.json (or a report directory holding one), checked enough to compare."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.exists():
        raise CompareError(f"{role} file not found: {path}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CompareError(f"{role} file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CompareError(
            f"{role} file {path} is not valid JSON: {exc.msg} (line {exc.lineno}, "
            f"column {exc.colno}; truncated or corrupt?)"
        ) from None
    except OSError as exc:
        raise CompareError(f"{role} file {path} cannot be read: {exc.strerror or exc}") from None
    validate(doc, f"{role} file {path}")
    return doc


def validate(doc: Any, where: str) -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not isinstance(doc.get("run"), dict):
        raise CompareError(f"{where} is not a wrapq results.json (it needs a 'run' object and a 'results' list)")
    if doc.get("schema", 1) != 1:
        raise CompareError(f"{where} has results schema {doc.get('schema')!r}; this harness reads schema 1")
    seen = set()
    for i, rec in enumerate(doc["results"]):
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("nodeid"), str)
            or not isinstance(rec.get("outcome"), str)
        ):
            raise CompareError(f"{where}: results[{i}] is not an item record (it needs a 'nodeid' and an 'outcome')")
        if rec["nodeid"] in seen:
            raise CompareError(f"{where}: item {rec['nodeid']} is recorded twice")
        seen.add(rec["nodeid"])
        if rec.get("metrics") is not None and not isinstance(rec["metrics"], dict):
            raise CompareError(f"{where}: results[{i}] ({rec['nodeid']}) has metrics that are not an object")


def version_differences(base: dict[str, Any], head: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(package, base version, head version) for every recorded package whose release differs
    (a local build label such as ``+cpu`` is the same release)."""
    bv = (base.get("run") or {}).get("versions") or {}
    hv = (head.get("run") or {}).get("versions") or {}
    out = []
    for name in sorted(set(bv) | set(hv)):
        b, h = bv.get(name), hv.get(name)
        if b == h or (b is not None and h is not None and same_release(str(h), str(b))):
            continue
        out.append((name, b, h))
    return out


def describe_versions(diffs: list[tuple[str, str | None, str | None]]) -> str:
    return ", ".join(f"{name} {b or 'not recorded'} -> {h or 'not recorded'}" for name, b, h in diffs)


# -- comparison ---------------------------------------------------------------------------------
def repro(nodeid: str, tico: str | None = None) -> str:
    return rerun.command(nodeid, tico=tico)


@dataclass
class VerdictChange:
    nodeid: str
    base: str | None  # outcome; None: the item is new
    head: str | None  # None: the item was removed
    kind: str  # worse / better / changed
    label: str
    message: str = ""
    tico: str | None = None  # the head's WRAPQ_TICO: the rerun runs the item on the tico that changed it

    @property
    def repro(self) -> str:
        return repro(self.nodeid, self.tico)


@dataclass
class MetricMove:
    nodeid: str
    check: str
    metric: str
    base: float
    head: float
    better: str  # lower / higher
    kind: str  # worse / better
    unit: str = ""
    tico: str | None = None

    @property
    def repro(self) -> str:
        return repro(self.nodeid, self.tico)

    @property
    def relative(self) -> float | None:
        """(head - base) / |base|; None when base is 0 or either side is not finite."""
        if self.base == 0 or not (math.isfinite(self.base) and math.isfinite(self.head)):
            return None
        return (self.head - self.base) / abs(self.base)


@dataclass
class Comparison:
    base_run: dict[str, Any]
    head_run: dict[str, Any]
    margin: float
    abs_floor: float
    version_diffs: list[tuple[str, str | None, str | None]]
    verdicts: list[VerdictChange] = field(default_factory=list)
    metrics: list[MetricMove] = field(default_factory=list)
    items_base: int = 0
    items_head: int = 0
    items_both: int = 0

    @property
    def worse_verdicts(self) -> list[VerdictChange]:
        return [v for v in self.verdicts if v.kind == WORSE]

    @property
    def worse_metrics(self) -> list[MetricMove]:
        return [m for m in self.metrics if m.kind == WORSE]

    def got_worse(self, fail_on: str = "any") -> bool:
        if fail_on == "none":
            return False
        verdict = bool(self.worse_verdicts) and fail_on in ("any", "verdict")
        metric = bool(self.worse_metrics) and fail_on in ("any", "metric")
        return verdict or metric

    def verdict_line(self) -> str:
        worse_v, worse_m = len(self.worse_verdicts), len(self.worse_metrics)
        if not worse_v and not worse_m:
            return "nothing got worse"
        parts = []
        if worse_v:
            parts.append(f"{worse_v} verdict(s) regressed")
        if worse_m:
            parts.append(f"{worse_m} metric(s) worse by more than {self.margin:.0%}")
        return "WORSE: " + ", ".join(parts)


def new_problems(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """The head's problem lines the base did not have, numbers, paths and line numbers aside
    (``harness/golden/baseline.signature``): an item red on both sides that the change made red anew."""
    known = {signature(line) for line in problem_lines(base)}
    return [line for line in problem_lines(head) if signature(line) not in known]


def classify(base: str | None, head: str | None) -> tuple[str, str] | None:
    """(kind, label) of an item's verdict change, None when unchanged."""
    if base == head:
        return None
    if base is None:
        return (WORSE, f"new failure ({head})") if head in BAD else (CHANGED, f"new item ({head})")
    if head is None:
        return CHANGED, f"removed item (was {base})"
    arrow = f"{base} -> {head}"
    if head in BAD:
        if base in BAD:
            return CHANGED, f"{arrow} (still failing)"
        if base == "xfailed":
            return (
                WORSE,
                "xfail -> fail (the expected failure no longer matches: a new problem, or the expected one is gone)",
            )
        return WORSE, f"{arrow} (regressed)"
    if base in BAD:
        if head == "passed":
            return BETTER, f"{arrow} (fixed)"
        if head == "xfailed":
            return BETTER, "fail -> xfail (now a declared, matching expectation)"
        return WORSE, f"{arrow} (a failure no longer checked)"
    if head == "skipped":
        return WORSE, f"{arrow} (no longer checked)"
    if base == "passed" and head == "xfailed":
        return WORSE, "passed -> xfail (now fails, as a new expectation declares)"
    if base == "xfailed" and head == "passed":
        return BETTER, "xfail -> passed (fixed; its expectation was removed)"
    if base == "skipped" and head == "passed":
        return BETTER, f"{arrow} (now checked)"
    return CHANGED, arrow


def _number(value: Any) -> float | None:
    """A metric value as a float: results.json writes non-finite floats as strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf", "nan", "infinity", "-infinity"):
        return float(value)
    return None


def _declared(doc: dict[str, Any], check: str | None) -> list[dict[str, Any]]:
    return ((((doc.get("run") or {}).get("checks") or {}).get(check or "") or {}).get("metrics")) or []


def _direction(decls: list[dict[str, Any]], key: str) -> tuple[str, str] | None:
    """(better, unit) of the declaration matching ``key`` (``peir[padded]`` matches ``peir``)."""
    base_name = key.split("[")[0]
    for metric in decls:
        name = metric.get("name") or ""
        if fnmatch.fnmatchcase(base_name, name) or fnmatch.fnmatchcase(key, name):
            better = metric.get("better")
            return (better, metric.get("unit") or "") if better in ("lower", "higher") else None
    return None


def metric_move(base: float, head: float, better: str, margin: float, abs_floor: float) -> str | None:
    """ "worse", "better" or None (within the margin). A NaN is worse than any number."""
    if base == head or (math.isnan(base) and math.isnan(head)):
        return None
    if math.isnan(head):
        return WORSE
    if math.isnan(base):
        return BETTER
    if math.isinf(base) or math.isinf(head):
        worse = head > base if better == "lower" else head < base
        return WORSE if worse else BETTER
    allowed = abs(base) * margin + abs_floor
    delta = head - base if better == "lower" else base - head  # > 0: worse
    if delta > allowed:
        return WORSE
    if -delta > allowed:
        return BETTER
    return None


def compare(
    base: dict[str, Any],
    head: dict[str, Any],
    *,
    margin: float = 0.1,
    abs_floor: float = ABS_FLOOR,
    allow_version_mismatch: bool = False,
) -> Comparison:
    validate(base, "base")
    validate(head, "head")
    if margin < 0 or abs_floor < 0:
        raise CompareError(f"margin and absolute floor must be >= 0 (got {margin}, {abs_floor})")
    # The tico under review is what a pull request changes: a tico version difference is compared.
    diffs = version_differences(base, head)
    blocking = [d for d in diffs if d[0] != "tico"]
    if blocking and not allow_version_mismatch:
        raise CompareError(
            f"refusing to compare runs on different pinned stacks: {describe_versions(blocking)} "
            f"(base -> head); their numbers differ for reasons no commit made. Rerun both on one "
            f"stack, or pass --allow-version-mismatch to compare anyway"
        )
    # runs recorded before today's node ids compare by the same items (harness/records/node_ids.py)
    brec = {node_ids.current(r["nodeid"]): r for r in base["results"]}
    hrec = {node_ids.current(r["nodeid"]): r for r in head["results"]}
    out = Comparison(
        base_run=base["run"],
        head_run=head["run"],
        margin=margin,
        abs_floor=abs_floor,
        version_diffs=diffs,
        items_base=len(brec),
        items_head=len(hrec),
        items_both=len(set(brec) & set(hrec)),
    )
    tico = ((head.get("run") or {}).get("tico") or {}).get("requested")
    for nodeid in sorted(set(brec) | set(hrec)):
        b, h = brec.get(nodeid), hrec.get(nodeid)
        change = classify(b["outcome"] if b else None, h["outcome"] if h else None)
        if b and h and b["outcome"] in BAD and h.get("baseline") == "pre-existing":
            change = None  # the head judged against this base: it fails the same way (harness/golden/baseline.py)
        fresh = new_problems(b, h) if b and h and b["outcome"] in BAD and h["outcome"] in BAD else []
        if fresh:
            change = WORSE, f"{b['outcome']} -> {h['outcome']} (still failing, with a new problem)"
        if change:
            kind, label = change
            message = (
                fresh[0]
                if fresh
                else headline(str((h or {}).get("message") or "")).removeprefix("- ")
                if h and h["outcome"] in BAD
                else ""
            )
            out.verdicts.append(
                VerdictChange(
                    nodeid, b["outcome"] if b else None, h["outcome"] if h else None, kind, label, message[:300], tico
                )
            )
        if not (b and h):
            continue
        check = h.get("check") or b.get("check")
        decls = _declared(head, check) or _declared(base, check)
        bm, hm = b.get("metrics") or {}, h.get("metrics") or {}
        for key in sorted(set(bm) & set(hm)):
            bv, hv = _number(bm[key]), _number(hm[key])
            declared = _direction(decls, key)
            if bv is None or hv is None or declared is None:
                continue
            kind = metric_move(bv, hv, declared[0], margin, abs_floor)
            if kind:
                out.metrics.append(MetricMove(nodeid, check or "", key, bv, hv, declared[0], kind, declared[1], tico))
    out.verdicts.sort(key=lambda v: (_KIND_ORDER[v.kind], v.nodeid))

    def size(m: MetricMove) -> float:
        rel = m.relative
        return abs(rel) if rel is not None else math.inf

    out.metrics.sort(key=lambda m: (_KIND_ORDER[m.kind], -size(m), m.nodeid, m.metric))
    return out
