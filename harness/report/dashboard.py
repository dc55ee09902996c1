"""The nightly trend dashboard: per testbed, a heat map of every tracked series, sparklines and
on-demand charts, the regressions the judging flags (harness/report/regression.py) with what an
alert says (harness/report/alerts.py), rendered to one self-contained HTML file."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

from markupsafe import Markup

from harness.records import rerun
from harness.records.results import atomic_write_text
from harness.report import alerts, svg
from harness.report import policy as policy_mod
from harness.report.history_store import CHART_RUNS, NOISE_FLOOR_REL, NOISE_RUNS, connect, testbed_label
from harness.report.html import template_environment
from harness.report.regression import change_start, judge, series


def heat_level(entry: dict[str, Any]) -> float | None:
    """How far the latest value moved, signed (> 0: worse), in units of the threshold that would
    flag it: noise units / noise_k where the noise is measurable, else the relative change /
    margin; 1.0 is the edge of the allowed band. None: no baseline yet."""
    if entry.get("baseline") is None:
        return None
    policy, worse = entry["policy"], entry["worse"]
    if entry.get("z") is not None and policy["noise_k"]:
        return entry["z"] / policy["noise_k"]
    if entry.get("relative") is not None:
        if policy["margin"] > 0:
            return entry["relative"] / policy["margin"]
        return math.copysign(math.inf, worse) if abs(worse) > policy["abs_floor"] else 0.0
    return math.copysign(math.inf, worse) if abs(worse) > policy["abs_floor"] else 0.0


def _bucket(level: float | None) -> str:
    """CSS class of a heat-map cell: w1..w4 worse, b1..b4 better (3 and 4: beyond the band, i.e.
    flagged), n0 within 40% of the band (e.g. within 1.2 sigma at k = 3)."""
    if level is None:
        return "nb"
    size = abs(level)
    step = 0 if size < 0.4 else 1 if size < 0.7 else 2 if size < 1 else 3 if size < 2 else 4
    return "n0" if step == 0 else ("w" if level > 0 else "b") + str(step)


def _nodeids_by_run(con: sqlite3.Connection) -> dict[tuple[str, str, str, int], str]:
    rows = con.execute("SELECT case_name, profile, check_name, run_id, nodeid FROM items")
    return {(case, profile, check, run_id): nodeid for case, profile, check, run_id, nodeid in rows}


def _families(con: sqlite3.Connection) -> dict[str, str]:
    """case -> family, as its newest item recorded it."""
    rows = con.execute("SELECT case_name, family FROM items WHERE family IS NOT NULL ORDER BY run_id")
    return {case: family for case, family in rows}


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def _hover(entry: dict[str, Any]) -> str:
    """The numbers behind a heat-map cell."""
    head = f"{entry['case']} [{entry['profile']}] {entry['check']} {entry['metric']}"
    if entry["baseline"] is None:
        return f"{head}: {_num(entry['latest'])} (no baseline yet)"
    parts = [f"{head}: {_num(entry['latest'])} vs median {_num(entry['baseline'])}"]
    if entry["relative"] is not None:
        parts.append(f"{(entry['latest'] - entry['baseline']) / abs(entry['baseline']):+.1%}")
    else:
        parts.append(f"change {entry['change']:+.4g}")
    parts.append(
        f"{entry['sigmas']:+.1f} x noise {entry['noise']:.3g}"
        if entry["sigmas"] is not None
        else "noise not measurable"
    )
    parts.append(f"allowed {entry['allowed']:.3g}")
    text = "; ".join(parts) + f"; {entry['status']}"
    if entry.get("moved"):
        text += f" ({entry['moved']['text']})"
    if entry.get("ack"):
        text += f"; acknowledged: {entry['ack']['reason']}"
    return text


def _sig(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def encode_values(values: list[float | None]) -> list[Any]:
    """A series' values, compact for the page: ``[exponent, "tokens"]`` where each value is an
    integer multiple of 10**exponent (5 significant digits of the largest), written as the change
    from the previous one; ``n`` is a run without a value, ``*k`` k repeats of the previous value.
    The page's script decodes it (``decode``); a steady 100-night series takes a few bytes."""
    finite = [abs(v) for v in values if v is not None]
    top = max(finite, default=0.0)
    exponent = (math.floor(math.log10(top)) - 4) if top > 0 else 0
    scale = 10.0**exponent
    tokens: list[str] = []
    previous, repeats = 0, 0
    for value in values:
        if value is None:
            if repeats:
                tokens.append(f"*{repeats}" if repeats > 1 else "0")
                repeats = 0
            tokens.append("n")
            continue
        q = round(value / scale)
        if q == previous and tokens:
            repeats += 1
            continue
        if repeats:
            tokens.append(f"*{repeats}" if repeats > 1 else "0")
            repeats = 0
        tokens.append(str(q - previous))
        previous = q
    if repeats:
        tokens.append(f"*{repeats}" if repeats > 1 else "0")
    return [exponent, ",".join(tokens)]


def dashboard(
    db: Path,
    out: Path,
    window: int = 5,
    margin: float = 0.1,
    acknowledgements: list[alerts.Acknowledgement] | None = None,
    policies: list[policy_mod.PolicyEntry] | None = None,
    chart_runs: int = CHART_RUNS,
) -> dict[str, Any]:
    """Render the dashboard; returns what it flagged. ``regressions`` are the unacknowledged
    ones (case, profile, check, metric); acknowledged changes, improvements and stale
    acknowledgements are listed apart, each flagged change with what moved where it started.
    Every series is judged within its testbed; policies resolve as harness/report/policy.py says."""
    con = connect(db)
    try:
        rows = con.execute(
            "SELECT id, started_at, commit_sha, versions, testbed, platform FROM runs ORDER BY id"
        ).fetchall()
        data, better, declared = series(con)
        nodeids = _nodeids_by_run(con)
        families = _families(con)
    finally:
        con.close()
    runs = [
        {
            "id": rid,
            "started_at": started,
            "commit": commit,
            "versions": json.loads(versions or "{}"),
            "testbed": testbed,
            "platform": json.loads(platform) if platform else None,
        }
        for rid, started, commit, versions, testbed, platform in rows
    ]
    by_id = {run["id"]: run for run in runs}
    latest = runs[-1] if runs else None
    # testbeds: the latest run's first, then by their newest run
    newest: dict[str | None, int] = {}
    for run in runs:
        newest[run["testbed"]] = run["id"]
    testbed_order = sorted(newest, key=lambda t: -newest[t])
    testbeds = []
    for index, tb in enumerate(testbed_order):
        tb_runs = [run for run in runs if run["testbed"] == tb]
        testbeds.append(
            {
                "id": tb,
                "index": index,
                "label": testbed_label(tb_runs[-1]["platform"]),
                "runs": tb_runs,
                "run_ids": [run["id"] for run in tb_runs],
                "entries": [],
                "platform": tb_runs[-1]["platform"],
            }
        )
    tb_by_id = {tb["id"]: tb for tb in testbeds}
    entries = []
    used_policies: set[int] = set()
    for key in sorted(data, key=lambda k: (tb_by_id[k[0]]["index"], k[1:])):
        testbed, case, profile, check, metric = key
        points = data[key]
        direction = better.get(key)
        if direction not in ("lower", "higher"):
            continue  # rows from before directions were stored: kept, not judged
        tb = tb_by_id[testbed]
        pol = policy_mod.resolve(declared.get(key), policies or [], margin, key)
        used_policies.update(int(src.split()[-1]) for src in pol["sources"].values() if src.startswith("policy entry"))
        by_run = dict(points)
        present = [(rid, by_run[rid]) for rid in tb["run_ids"] if rid in by_run]
        lower = direction == "lower"
        verdict = judge([v for _, v in present], lower, window, pol["margin"], pol["noise_k"], pol["abs_floor"])
        status = "new" if verdict["baseline"] is None else "ok"
        moved = None
        if verdict["regressed"] or verdict["improved"]:
            status = "regressed" if verdict["regressed"] else "improved"
            start = change_start(present, lower, window, pol["margin"], verdict["regressed"], verdict["allowed"])
            moved = alerts.what_moved(by_id[present[start - 1][0]], by_id[present[start][0]])
        nodeid = nodeids.get((case, profile, check, present[-1][0]))
        entry = {
            "testbed": testbed,
            "case": case,
            "profile": profile,
            "check": check,
            "metric": metric,
            "family": families.get(case) or "unknown",
            "values": [by_run.get(rid) for rid in tb["run_ids"]],
            "lower_is_better": lower,
            **verdict,
            "status": status,
            "moved": moved,
            "ack": None,
            "policy": pol,
            "latest_run": present[-1][0],
            "nodeid": nodeid,
            "repro": rerun.command(nodeid) if nodeid else None,
        }
        entries.append(entry)
        tb["entries"].append(entry)
    stale = alerts.apply(acknowledgements or [], entries, runs)
    for i, entry in enumerate(entries):
        entry["index"] = i
        entry["cause"] = (
            "dependency"
            if entry["moved"] and entry["moved"]["dependency_bump"]
            else "commit"
            if entry["moved"] and entry["moved"]["commit_moved"]
            else "unchanged"
            if entry["moved"]
            else None
        )
        entry["level"] = heat_level(entry)
        entry["cell"] = _bucket(entry["level"])
        entry["hover"] = _hover(entry)
        tb = tb_by_id[entry["testbed"]]
        shown = entry["values"][-chart_runs:]
        entry["spark"] = Markup(svg.sparkline(shown, flagged=entry["status"] == "regressed"))
        entry["policy_text"] = policy_mod.describe(entry["policy"])
    heatmaps = [_heatmap(tb) for tb in testbeds]
    family_rows = _family_summary(entries)
    primary = [run for run in runs if latest and run["testbed"] == latest["testbed"]]
    versions_moved = (
        alerts.describe_version_moves(alerts.version_moves(primary[-1 - window : -1], latest)) if latest else ""
    )
    chart_data = {
        "window": window,
        "testbeds": [
            {
                "label": tb["label"],
                "runs": [
                    [run["id"], run["started_at"], (run["commit"] or "")[:12], _run_moves(tb["runs"], j)]
                    for j, run in enumerate(tb["runs"])
                ][-chart_runs:],
            }
            for tb in testbeds
        ],
        "series": [
            [
                tb_by_id[e["testbed"]]["index"],
                f"{e['case']} [{e['profile']}] {e['check']} {e['metric']}",
                1 if e["lower_is_better"] else 0,
                encode_values(e["values"][-chart_runs:]),
                _sig(e["baseline"]),
                _sig(e["allowed"]),
                e["status"],
                e["policy_text"],
            ]
            for e in entries
        ],
    }
    env = template_environment(strict=False)
    env.filters["num"] = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v)
    by_status = {s: [e for e in entries if e["status"] == s] for s in ("regressed", "acknowledged", "improved")}
    unused = [p for p in (policies or []) if p.index not in used_policies]
    html = env.get_template("dashboard.html.j2").render(
        runs=rows,
        entries=entries,
        regressions=by_status["regressed"],
        acknowledged=by_status["acknowledged"],
        improvements=by_status["improved"],
        stale=stale,
        versions_moved=versions_moved,
        window=window,
        margin=margin,
        testbeds=testbeds,
        heatmaps=heatmaps,
        families=family_rows,
        multi_testbed=len(testbeds) > 1,
        chart_data=Markup(
            json.dumps(chart_data, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        ),
        noise_floor=NOISE_FLOOR_REL,
        noise_runs=NOISE_RUNS,
        unused_policies=unused,
        chart_runs=chart_runs,
    )
    atomic_write_text(out, html)

    def key(e: dict[str, Any]) -> tuple[str, str, str, str]:
        return (e["case"], e["profile"], e["check"], e["metric"])

    def plain(e: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in e.items() if k not in ("spark", "values", "hover")}

    return {
        "runs": len(runs),
        "series": len(entries),
        "window": window,
        "margin": margin,
        "latest": {k: latest[k] for k in ("id", "started_at", "commit")} if latest else None,
        "versions_moved": versions_moved,
        "testbeds": [
            {"id": tb["id"], "label": tb["label"], "runs": len(tb["runs"]), "series": len(tb["entries"])}
            for tb in testbeds
        ],
        "regressions": [key(e) for e in by_status["regressed"]],
        "acknowledged": [key(e) for e in by_status["acknowledged"]],
        "improvements": [key(e) for e in by_status["improved"]],
        "regression_entries": [plain(e) for e in by_status["regressed"]],
        "acknowledged_entries": [plain(e) for e in by_status["acknowledged"]],
        "improvement_entries": [plain(e) for e in by_status["improved"]],
        "families": family_rows,
        "unused_policies": [{"index": p.index, "reason": p.reason} for p in unused],
        "stale": stale,
        "acknowledgements_count": len(acknowledgements or []),
    }


def _run_moves(tb_runs: list[dict[str, Any]], j: int) -> str:
    """What moved into run j of a testbed from the run before it ("" when nothing did)."""
    if j == 0:
        return ""
    moves = alerts.version_moves([tb_runs[j - 1]], tb_runs[j])
    return ", ".join(f"{name} {old} -> {new}" for name, old, new in moves)


def _heatmap(tb: dict[str, Any]) -> dict[str, Any]:
    """Rows (case, profile) grouped by family, columns (check, metric): one testbed's latest run."""
    columns = sorted({(e["check"], e["metric"]) for e in tb["entries"]})
    col_index = {c: i for i, c in enumerate(columns)}
    rows: dict[tuple[str, str, str], list[dict[str, Any] | None]] = {}
    for e in tb["entries"]:
        row = rows.setdefault((e["family"], e["case"], e["profile"]), [None] * len(columns))
        row[col_index[(e["check"], e["metric"])]] = e
    ordered = sorted(rows.items())
    out_rows, previous_family = [], None
    for (family, case, profile), cells in ordered:
        span = sum(1 for (f, _, _), _ in ordered if f == family) if family != previous_family else 0
        out_rows.append({"family": family, "span": span, "case": case, "profile": profile, "cells": cells})
        previous_family = family
    return {"testbed": tb, "columns": columns, "rows": out_rows}


def _family_summary(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        row = out.setdefault(
            e["family"],
            {
                "family": e["family"],
                "cases": set(),
                "series": 0,
                "regressed": 0,
                "acknowledged": 0,
                "improved": 0,
                "steady": 0,
                "new": 0,
            },
        )
        row["cases"].add(e["case"])
        row["series"] += 1
        row[{"ok": "steady"}.get(e["status"], e["status"])] += 1
    return [{**row, "cases": len(row["cases"])} for _, row in sorted(out.items())]
