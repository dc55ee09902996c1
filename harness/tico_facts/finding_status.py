"""What a run says about tico's findings: each one open, fixed or new, where it was seen, the
failures that a tico API change explains (the case must follow it), and the problems nothing explains. Read
from the item records (``findings``, ``looks_like``), so the
same function serves the terminal, results.json, the report, ``python -m harness findings`` and
``compare`` between two runs."""

from __future__ import annotations

import re
from typing import Any, Iterable

from harness.records import rerun
from harness.tico_facts.findings_data import FindingsError, api_change_of, registry, shows_every_symptom

OPEN, FIXED, NEW = "open", "fixed", "new"
_FAILED = ("failed", "error", "crashed")
_RAN = ("passed", "xfailed", *_FAILED)
# what differs between items with the same problem: numbers, layer indices, quoted sizes
_VARYING = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


def _where(record: dict[str, Any]) -> str:
    return f"{record.get('case')}[{record.get('profile')}]::{record.get('check')}"


def reproduce_command(nodeid: str, tico: str | None = None) -> str:
    return rerun.command(nodeid, tico=tico)


def item_lines(record: dict[str, Any]) -> list[str]:
    """Every line a failed item said: its problems, its failed stage's message, pytest's report."""
    stage = record.get("stage_error") or {}
    text = "\n".join([*(record.get("problems") or []), stage.get("message") or "", record.get("message") or ""])
    return text.splitlines()


def confirm_suggestions(records: Iterable[dict[str, Any]]) -> None:
    """Keep, of the findings each failed item's lines resemble (``looks_like``, set by the item), those
    whose every symptom its (case, profile) group shows (``findings_data.shows_every_symptom``); the rest
    move to ``looks_like_unconfirmed``, and the failure reads as a new problem."""
    records = list(records)
    groups: dict[tuple[Any, Any], dict[str, list[str]]] = {}
    for record in records:
        if record.get("check") and record.get("outcome") in _RAN:
            lines = item_lines(record) if record["outcome"] != "passed" else []
            groups.setdefault((record.get("case"), record.get("profile")), {})[record["check"]] = lines
    for record in records:
        candidates = record.get("looks_like")
        if not candidates:
            continue
        group = groups.get((record.get("case"), record.get("profile")), {})
        kept = [fid for fid in candidates if shows_every_symptom(fid, group)]
        if kept != list(candidates):
            record["looks_like"] = kept
            record.setdefault("looks_like_unconfirmed", []).extend(f for f in candidates if f not in kept)


def failure_explained_by(record: dict[str, Any]) -> tuple[str, ...] | str | None:
    """What the findings data explains a failed item by: the findings it looks like (a tuple of
    ids), else the tico change its case must follow (an id), else None."""
    if record.get("looks_like"):
        return tuple(record["looks_like"])
    return api_change_of(item_lines(record), _where(record))


def summarize(records: Iterable[dict[str, Any]], tico: str | None = None) -> dict[str, Any]:
    """``{"findings": [...], "api_changes": [...], "new_problems": [...]}`` for one run's item
    records (a failure's resemblance to a finding confirmed on its group first); ``tico``: the WRAPQ_TICO the
    run was given, for the commands that reproduce each one."""
    records = list(records)
    confirm_suggestions(records)
    seen: dict[str, dict[str, Any]] = {}
    api_changes: dict[str, dict[str, Any]] = {}
    new_problems = []

    def entry(fid: str) -> dict[str, Any]:
        if fid not in seen:
            try:
                title = registry().get(fid).title
            except FindingsError:
                title = "(not in findings/tico.toml)"
            seen[fid] = {
                "id": fid,
                "title": title,
                "occurs": [],
                "partly_fixed": [],
                "fixed": [],
                "undeclared": [],
                "reproduce": None,
            }
        return seen[fid]

    for record in records:
        for fid, status in (record.get("findings") or {}).items():
            if fid.startswith("the case's own diagnosis"):
                continue
            item = entry(fid)
            key = {"occurs": "occurs", "changed": "partly_fixed", "fixed": "fixed"}[status]
            item[key].append(_where(record))
            if status != "fixed" and item["reproduce"] is None and record.get("nodeid"):
                item["reproduce"] = reproduce_command(record["nodeid"], tico)
        if record.get("outcome") in _FAILED:
            explained = failure_explained_by(record)
            for fid in explained if isinstance(explained, tuple) else ():
                item = entry(fid)
                item["undeclared"].append(_where(record))
                if item["reproduce"] is None and record.get("nodeid"):
                    item["reproduce"] = reproduce_command(record["nodeid"], tico)
            if isinstance(explained, str):
                change = explained
                if change not in api_changes:
                    api = registry().api_changes[change]
                    api_changes[change] = {
                        "id": change,
                        "title": api.title,
                        "since": api.since,
                        "follow": api.follow,
                        "items": [],
                        "reproduce": reproduce_command(record["nodeid"], tico) if record.get("nodeid") else None,
                    }
                api_changes[change]["items"].append(_where(record))
            elif explained is None:
                problems = record.get("problems") or []
                stage = record.get("stage_error")
                message = (record.get("message") or "").strip().splitlines()
                if problems:
                    first = problems[0]
                elif stage:
                    first = f"stage '{stage.get('stage')}' failed: {stage.get('type')}"
                else:
                    first = message[0] if message else ""
                new_problems.append(
                    {
                        "where": _where(record),
                        "nodeid": record.get("nodeid"),
                        "problem": first,
                    }
                )
    findings = []
    for item in seen.values():
        if item["occurs"] or item["partly_fixed"]:
            item["status"] = OPEN
        elif item["fixed"]:
            item["status"] = FIXED
        else:
            item["status"] = NEW
        findings.append(item)
    order = {NEW: 0, OPEN: 1, FIXED: 2}
    findings.sort(key=lambda f: (order[f["status"]], f["id"]))
    return {
        "findings": findings,
        "api_changes": sorted(api_changes.values(), key=lambda a: a["id"]),
        "new_problems": new_problems,
    }


def render_lines(summary: dict[str, Any], width: int = 118) -> list[str]:
    """One line per finding (and per new problem), for the terminal."""
    lines = []
    for item in summary["findings"]:
        counts = f"{len(item['occurs']) + len(item['partly_fixed'])} item(s)"
        if item["status"] == NEW:
            counts = f"on {len(item['undeclared'])} item(s) that do not declare it (red)"
        elif item["status"] == FIXED:
            counts = f"fixed on {len(item['fixed'])} item(s): python -m harness findings"
        elif item["partly_fixed"]:
            counts += f", partly fixed on {len(item['partly_fixed'])}"
        if item["undeclared"] and item["status"] != NEW:
            counts += f"; on {len(item['undeclared'])} item(s) that do not declare it (red)"
        line = f"{item['status']:<6} {item['id']}: {item['title']} -- {counts}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    for change in summary.get("api_changes", []):
        line = f"api    {change['id']}: {len(change['items'])} item(s) red until the case follows: {change['title']}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    groups = group_new_problems(summary["new_problems"])
    for group in groups:
        first = group[0]
        if len(group) == 1:
            line = f"new    {first['where']}: {first['problem']}"
        else:
            line = f"new    {len(group)} items ({first['where']}, ...): {first['problem']}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    if groups:
        lines.append(f"       a suggested finding record per shape ({len(groups)}): python -m harness findings")
    return lines


def problem_shape(problem: str) -> str:
    """A problem line with what varies between items masked, so one cause reads as one shape."""
    return _VARYING.sub("#", problem)


def group_new_problems(problems: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """New problems grouped by shape, in first-seen order: one terminal line per cause, with its count."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for problem in problems:
        groups.setdefault(problem_shape(problem["problem"]), []).append(problem)
    return list(groups.values())


def compare(base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, str]]:
    """Per finding: what the head run changed relative to the base run ('fixed', 'new', 'still open', ...)."""
    before = {f["id"]: f["status"] for f in base.get("findings", [])}
    after = {f["id"]: f["status"] for f in head.get("findings", [])}
    rows = []
    for fid in sorted(set(before) | set(after)):
        b, a = before.get(fid, "absent"), after.get(fid, "absent")
        if b == a:
            change = f"still {a}"
        elif a == FIXED or (b in (OPEN, NEW) and a == "absent"):
            change = "fixed"
        elif a in (OPEN, NEW) and b in ("absent", FIXED):
            change = "new" if b == "absent" else "came back"
        else:
            change = f"{b} -> {a}"
        rows.append({"id": fid, "base": b, "head": a, "change": change})
    return rows
