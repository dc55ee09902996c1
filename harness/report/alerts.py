"""What the nightly dashboard alerts on, and what it says moved (issue #21).

- **Acknowledgements**: a reviewed, committed file (``acknowledged.toml`` at the repository
  root by default, or ``.json``) listing expected changes -- case, profile, check, metric
  (fnmatch patterns), from which run, commit or date, the reason and a link. A flagged change
  whose series matches an entry, and whose change started at the entry's point, is shown as
  acknowledged instead of regressed and does not fail ``--fail-on-regression``; an entry that
  matches no flagged change is reported as stale (with why), so the file does not rot.
- **What moved**: for each flagged change, the run where the series left its baseline and the
  run before it, with the commit and the recorded package versions of both, so a dependency
  bump ("versions moved: tico 0.3.0 -> 0.3.1", same commit) is told apart from a commit.
- **Summary**: the regressions, acknowledged changes, improvements and stale entries as
  markdown, for a CI job summary or an issue comment.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from harness.records.results import same_release
from harness.report.reviewed_file import check_fields, entry_tables, read_document

DEFAULT_FILE = "acknowledged.toml"
_FIELDS = {"case", "profile", "check", "metric", "run", "commit", "date", "reason", "link"}
_POINTS = ("run", "commit", "date")


class AckError(ValueError):
    """An acknowledgements file that cannot be used as it is (the message names entry and field)."""


@dataclass(frozen=True)
class Acknowledgement:
    index: int  # 1-based position in the file, for messages
    case: str
    profile: str
    check: str
    metric: str
    reason: str
    run: int | None = None
    commit: str | None = None
    date: str | None = None
    link: str | None = None

    def matches(self, case: str, profile: str, check: str, metric: str) -> bool:
        return all(
            fnmatch.fnmatchcase(value or "", pattern)
            for value, pattern in (
                (case, self.case),
                (profile, self.profile),
                (check, self.check),
                (metric, self.metric),
            )
        )

    @property
    def series(self) -> str:
        return f"{self.case}[{self.profile}] {self.check} {self.metric}"

    @property
    def since(self) -> str:
        if self.run is not None:
            return f"run {self.run}"
        if self.commit is not None:
            return f"commit {self.commit}"
        return f"date {self.date}"

    def start_run(self, runs: list[dict[str, Any]]) -> int | None:
        """The first run (by id) this entry points at, or None when no run of the history does."""
        for run in runs:
            if self.run is not None and run["id"] == self.run:
                return run["id"]
            if self.commit is not None and (run.get("commit") or "").lower().startswith(self.commit.lower()):
                return run["id"]
            if self.date is not None and (run.get("started_at") or "") >= self.date:
                return run["id"]
        return None

    def unresolved(self) -> str:
        if self.run is not None:
            return f"run {self.run} is not in the history"
        if self.commit is not None:
            return f"commit {self.commit} is in no run of the history"
        return f"no run of the history started on or after {self.date}"

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "series": self.series,
            "since": self.since,
            "reason": self.reason,
            "link": self.link,
        }


def _entry(index: int, raw: Any, where: str) -> Acknowledgement:
    label = f"{where}: entry {index}"
    check_fields(raw, _FIELDS, label, AckError)
    named = " ".join(str(raw[k]) for k in ("case", "check", "metric") if isinstance(raw.get(k), str))
    label = f"{label} ({named})" if named else label
    for name in ("case", "check", "metric", "reason"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise AckError(f"{label}: '{name}' is required (a non-empty string)")
    if "profile" in raw and (not isinstance(raw["profile"], str) or not raw["profile"].strip()):
        raise AckError(f"{label}: 'profile' must be a non-empty string (omit it for every profile)")
    points = [name for name in _POINTS if name in raw]
    if len(points) != 1:
        raise AckError(
            f"{label}: give exactly one of run, commit or date -- from which run the change is "
            f"expected (got {', '.join(points) or 'none'})"
        )
    run = commit = date = None
    if "run" in raw:
        if not isinstance(raw["run"], int) or isinstance(raw["run"], bool) or raw["run"] < 1:
            raise AckError(f"{label}: 'run' must be a run id of the history (a positive integer)")
        run = raw["run"]
    if "commit" in raw:
        commit = raw["commit"]
        if (
            not isinstance(commit, str)
            or len(commit.strip()) < 7
            or any(c not in "0123456789abcdefABCDEF" for c in commit.strip())
        ):
            raise AckError(
                f"{label}: 'commit' must be a commit sha or a prefix of at least 7 hex digits, got {commit!r}"
            )
        commit = commit.strip()
    if "date" in raw:
        value = raw["date"]
        if isinstance(value, _dt.datetime):
            value = (
                value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if value.tzinfo else value.isoformat()
            )
        elif isinstance(value, _dt.date):
            value = value.isoformat()
        if not isinstance(value, str):
            raise AckError(f"{label}: 'date' must be a date (2026-12-01) or an ISO timestamp")
        try:
            _dt.date.fromisoformat(value[:10])
        except ValueError:
            raise AckError(f"{label}: 'date' must be a date (2026-12-01) or an ISO timestamp, got {value!r}") from None
        date = value
    link = raw.get("link")
    if link is not None and not isinstance(link, str):
        raise AckError(f"{label}: 'link' must be a string")
    return Acknowledgement(
        index=index,
        case=raw["case"],
        profile=raw.get("profile", "*"),
        check=raw["check"],
        metric=raw["metric"],
        reason=raw["reason"].strip(),
        run=run,
        commit=commit,
        date=date,
        link=link,
    )


def parse_acknowledgements(data: Any, where: str) -> list[Acknowledgement]:
    entries = entry_tables(data, "acknowledged", where, AckError)
    return [_entry(i, raw, where) for i, raw in enumerate(entries, start=1)]


def load_acknowledgements(path: Path) -> list[Acknowledgement]:
    """Entries of a .toml or .json acknowledgements file; AckError names what is wrong."""
    return parse_acknowledgements(read_document(path, "acknowledgements", AckError), str(path))


# -- what moved ---------------------------------------------------------------------------------
def _same(a: str | None, b: str | None) -> bool:
    return a == b or (a is not None and b is not None and same_release(str(a), str(b)))


def version_moves(before: Iterable[dict[str, Any]], after: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(package, old version(s), new version) for every recorded package whose version in
    ``after`` differs from one in any of the ``before`` runs' versions."""
    before = list(before)
    names = sorted({name for run in before for name in run.get("versions", {})} | set(after.get("versions", {})))
    moves = []
    for name in names:
        new = after.get("versions", {}).get(name)
        old = []
        for run in before:
            value = run.get("versions", {}).get(name)
            if not _same(value, new) and (value or "not recorded") not in old:
                old.append(value or "not recorded")
        if old:
            moves.append((name, "/".join(old), new or "not recorded"))
    return moves


def describe_version_moves(moves: list[tuple[str, str, str]]) -> str:
    return ("versions moved: " + ", ".join(f"{name} {old} -> {new}" for name, old, new in moves)) if moves else ""


def _short(commit: str | None) -> str:
    return (commit or "unknown")[:12]


def what_moved(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Between two runs: versions that moved, and whether the commit did."""
    moves = version_moves([before], after)
    commit_moved = (before.get("commit") or None) != (after.get("commit") or None)
    parts = []
    if moves:
        parts.append(describe_version_moves(moves))
    parts.append(
        f"commit {_short(before.get('commit'))} -> {_short(after.get('commit'))}"
        if commit_moved
        else f"same commit {_short(after.get('commit'))}"
    )
    if not moves:
        parts.append("versions unchanged")
    return {
        "from_run": before["id"],
        "to_run": after["id"],
        "versions": moves,
        "commit_moved": commit_moved,
        "dependency_bump": bool(moves) and not commit_moved,
        "text": "; ".join(parts),
    }


# -- acknowledgements against the flagged changes -----------------------------------------------
def apply(
    acks: list[Acknowledgement], entries: list[dict[str, Any]], runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Mark each flagged entry a matching acknowledgement covers (``entry["ack"]``; a covered
    regression's status becomes "acknowledged"); returns the stale acknowledgements, each with
    why it matched nothing. An entry covers a change whose first run away from the baseline is
    at or after its point and whose run before that is before it: the change it names, not a
    later one in the same series."""
    stale = []
    for ack in acks:
        start = ack.start_run(runs)
        matching = [e for e in entries if ack.matches(e["case"], e["profile"], e["check"], e["metric"])]
        flagged = [e for e in matching if e["status"] in ("regressed", "acknowledged", "improved")]
        covered = [e for e in flagged if start is not None and e["moved"]["from_run"] < start <= e["moved"]["to_run"]]
        for entry in covered:
            if entry.get("ack") is None:
                entry["ack"] = ack.describe()
                if entry["status"] == "regressed":
                    entry["status"] = "acknowledged"
        if covered:
            continue
        if start is None:
            why = ack.unresolved()
        elif not matching:
            why = "matches no series of the history (check the case, profile, check and metric names)"
        elif not flagged:
            why = (
                f"none of its {len(matching)} series moved beyond the margin in the latest run (the change is "
                f"in the baseline now, or it did not happen): remove the entry"
            )
        else:
            starts = sorted({f"run {e['moved']['to_run']}" for e in flagged})
            why = (
                f"the matching change(s) started at {', '.join(starts)}, not at its {ack.since} (run {start}): "
                f"a different change"
            )
        stale.append({**ack.describe(), "why": why})
    return stale


# -- summary ------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # "<" and "&" escaped: no raw HTML reaches the page ("->" stays readable)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")


def _code(value: str) -> str:
    value = value.replace("\n", " ").replace("|", "\\|")
    fence = "`"
    while fence in value:
        fence += "`"
    return f"{fence}{value}{fence}"


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def _change(entry: dict[str, Any]) -> str:
    base, latest = entry.get("baseline"), entry.get("latest")
    if not base:
        return _num(entry.get("change"))
    return f"{(latest - base) / abs(base):+.1%}"


def _rows(entries: list[dict[str, Any]], extra: str | None = None) -> list[str]:
    head = "| series | latest | median of previous | change | what moved | repro |"
    if extra:
        head += f" {extra} |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        direction = "lower" if e["lower_is_better"] else "higher"
        row = (
            f"| {_cell(e['case'])} [{_cell(e['profile'])}] {_cell(e['check'])} {_code(e['metric'])} ({direction} is "
            f"better) | {_num(e['latest'])} | {_num(e['baseline'])} | {_change(e)} | {_cell(e['moved']['text'])} | "
            f"{_code(e['repro']) if e.get('repro') else ''} |"
        )
        if extra:
            ack = e.get("ack") or {}
            reason = _cell(ack.get("reason"))
            if ack.get("link"):
                reason += f" ([link]({_cell(ack['link'])}))"
            row += f" {reason} ({_cell(ack.get('since'))}) |"
        lines.append(row)
    return lines


def summary_markdown(summary: dict[str, Any]) -> str:
    """The dashboard's alerts as markdown: regressions (with what moved and the repro command)
    first, then acknowledged changes, improvements and stale acknowledgements."""
    latest = summary.get("latest") or {}
    lines = ["## wrapq nightly accuracy", ""]
    lines.append(
        f"- {summary['runs']} runs, {summary['series']} series; latest run {latest.get('id', '-')} "
        f"(commit {_code(_short(latest.get('commit')))}, {_cell(latest.get('started_at') or '?')}); baseline: "
        f"median of the previous {summary['window']} runs; flagged beyond {summary['margin']:.0%}"
    )
    if summary.get("versions_moved"):
        lines.append(f"- {_cell(summary['versions_moved'])} (latest run against its baseline window)")
    if summary.get("acknowledgements_file"):
        lines.append(
            f"- acknowledgements: {_code(str(summary['acknowledgements_file']))} "
            f"({summary.get('acknowledgements_count', 0)} entries)"
        )
    regressions = summary["regression_entries"]
    lines += [
        "",
        f"**{len(regressions)} unacknowledged regression(s)**" if regressions else "**no unacknowledged regression**",
        "",
    ]
    sections = [
        ("Regressions", regressions, None),
        ("Acknowledged", summary["acknowledged_entries"], "reason"),
        ("Improvements", summary["improvement_entries"], None),
    ]
    for title, entries, extra in sections:
        if entries:
            lines += [f"### {title} ({len(entries)})", "", *_rows(entries, extra), ""]
    if summary.get("stale"):
        lines += [
            f"### Stale acknowledgements ({len(summary['stale'])})",
            "",
            "| entry | series | since | reason | why stale |",
            "|---|---|---|---|---|",
        ]
        for s in summary["stale"]:
            lines.append(
                f"| {s['index']} | {_cell(s['series'])} | {_cell(s['since'])} | {_cell(s['reason'])} | "
                f"{_cell(s['why'])} |"
            )
        lines.append("")
    return "\n".join(lines)
