"""Self-contained HTML report (inline CSS, SVG and a few lines of JS; no network), rendered
with jinja2 autoescaping from results.json alone -- the same file CI keeps as an artifact.
Its metric columns are the checks' declared headline metrics, and each check's details are
its own report fragment (``Check.report``), both carried in results.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.records import rerun
from harness.records.results import atomic_write_text
from harness.report import svg
from harness.report.headline import headline_columns, headline_values
from harness.tico_facts.wrapper_coverage import aggregate, from_results

# Worst first: a case's status is the worst outcome among its checks.
STATUS_ORDER = ["crashed", "error", "failed", "not_run", "pending", "xfailed", "passed", "skipped"]


_RED = ("crashed", "error", "failed", "not_run")


def _worst(outcomes: list[str]) -> str:
    return min(outcomes, key=lambda o: STATUS_ORDER.index(o) if o in STATUS_ORDER else 0) if outcomes else "not_run"


def case_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (case, profile) with its checks, headline metrics and rerun command."""
    columns = headline_columns((doc.get("run") or {}).get("checks") or {})
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in doc.get("results", []):
        key = (rec.get("case") or rec["nodeid"], rec.get("profile") or "")
        row = rows.setdefault(
            key,
            {
                "case": key[0],
                "profile": key[1],
                "family": rec.get("family") or "?",
                "checks": {},
                "file": rec["nodeid"].split("::")[0],
                "seconds": 0.0,
                "timings": {},
            },
        )
        row["checks"][rec.get("check") or "<definition>"] = rec
        row["seconds"] += float(rec.get("duration") or 0.0)
        for stage, secs in (rec.get("stage_timings") or {}).items():
            row["timings"][stage] = max(row["timings"].get(stage, 0.0), float(secs))
    out = []
    for row in rows.values():
        row["status"] = _worst([r["outcome"] for r in row["checks"].values()])
        outcomes = [r["outcome"] for r in row["checks"].values()]
        row["counts"] = [(o, outcomes.count(o)) for o in STATUS_ORDER if o in outcomes]
        row["failed_checks"] = sorted(name for name, r in row["checks"].items() if r["outcome"] in _RED)
        row["headline"] = headline_values(row["checks"], columns)
        row["wrappers"] = next(
            (r["wrapper_coverage"] for r in row["checks"].values() if isinstance(r.get("wrapper_coverage"), dict)), None
        )
        # the row's red items exactly; a green row reruns its case (every profile this run had)
        red = sorted(r["nodeid"] for r in row["checks"].values() if r["outcome"] in _RED and r.get("check"))
        whole = f"{row['file']}::{row['case']}" if row["profile"] else row["file"]
        row["rerun"] = rerun.command(*red) if red else rerun.command(whole)
        row["anchor"] = f"{row['case']}-{row['profile']}".replace("[", "").replace("]", "")
        out.append(row)
    return sorted(
        out,
        key=lambda r: (STATUS_ORDER.index(r["status"]) if r["status"] in STATUS_ORDER else 0, r["case"], r["profile"]),
    )


def _fragments(env: jinja2.Environment, checks: dict[str, Any]) -> dict[str, jinja2.Template]:
    """Each check's report fragment, compiled once; a fragment that does not compile is shown as
    such in the report rather than breaking it."""
    compiled = {}
    for name, meta in checks.items():
        source = meta.get("report")
        if not source:
            continue
        try:
            compiled[name] = env.from_string(source)
        except jinja2.TemplateError as exc:
            compiled[name] = env.from_string(
                '<p class="failed">report fragment of {{ check }} does not compile: {{ error }}</p>',
                globals={"check": name, "error": str(exc)},
            )
    return compiled


def wrapper_coverage_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per profile and wrapper class: the cases that ran it standalone / as a child in QUANT
    (the ``wrapper_coverage`` records of this run; harness.tico_facts.wrapper_coverage)."""

    profiles = sorted({rec.get("profile") for rec in doc.get("results", []) if rec.get("wrapper_coverage")} - {None})
    out = []
    for profile in profiles:
        for name, slot in sorted(aggregate(from_results(doc, profile)).items()):
            out.append({"profile": profile, "wrapper": name, **slot})
    return out


def template_environment(strict: bool = True) -> jinja2.Environment:
    """The report package's templates (harness/report/templates), autoescaped; ``strict``: a variable
    a template names and the page lacks is an error, not an empty string."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined if strict else jinja2.Undefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _env() -> jinja2.Environment:
    env = template_environment()
    env.filters["num"] = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else v)
    env.filters["scatter"] = lambda points: Markup(svg.scatter(points or []))
    env.filters["histogram"] = lambda h: Markup(svg.histogram((h or {}).get("edges", []), (h or {}).get("counts", [])))
    env.filters["bars"] = lambda items: Markup(svg.bars(items or [], label="gain with the site off"))
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, sort_keys=True, default=str)
    return env


def render_report(doc: dict[str, Any]) -> str:
    rows = case_rows(doc)
    checks = sorted({name for row in rows for name in row["checks"]})
    families = sorted({row["family"] for row in rows})
    statuses = [s for s in STATUS_ORDER if any(row["status"] == s for row in rows)]
    declared = (doc.get("run") or {}).get("checks") or {}
    env = _env()
    fragments = _fragments(env, declared)

    def fragment(name: str, rec: dict[str, Any]) -> Markup:
        template = fragments.get(name)
        if template is None:
            return Markup("")
        try:
            return Markup(template.render(rec=rec))
        except Exception as exc:  # noqa: BLE001 - one check's fragment must not lose the report
            return Markup(
                f'<p class="failed">report fragment of {Markup.escape(name)} failed: '
                f"{Markup.escape(type(exc).__name__)}: {Markup.escape(str(exc))}</p>"
            )

    return env.get_template("report.html.j2").render(
        doc=doc,
        run=doc.get("run", {}),
        rows=rows,
        checks=checks,
        families=families,
        statuses=statuses,
        columns=headline_columns(declared),
        fragment=fragment,
        wrapper_rows=wrapper_coverage_rows(doc),
    )


def write_report(doc: dict[str, Any], path: Path) -> Path:
    atomic_write_text(path, render_report(doc))
    return path
