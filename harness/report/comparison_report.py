"""A run comparison (harness/report/run_compare.py) rendered for people: the terminal text, a pull
request's Markdown job summary, and a self-contained HTML page."""

from __future__ import annotations

import math
from typing import Any

from tabulate import tabulate

from harness.golden.platform_info import TESTBED_KEYS
from harness.report.html import template_environment
from harness.report.run_compare import WORSE, Comparison, MetricMove, describe_versions
from harness.tico_facts.finding_status import compare as compare_findings
from harness.tico_facts.tico_identity import describe


def fmt(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.6g}"


def fmt_relative(move: MetricMove) -> str:
    rel = move.relative
    if rel is not None:
        return f"{rel:+.1%}"
    delta = move.head - move.base
    return "n/a" if math.isnan(delta) else f"{delta:+.3g}"


def _run_label(run: dict[str, Any]) -> str:
    commit = run.get("commit") or "unknown commit"
    return f"{commit[:12]} ({run.get('started_at') or '?'})"


def platform_differences(base_run: dict[str, Any], head_run: dict[str, Any]) -> list[str]:
    """How the testbeds of two runs differ (``run.platform``; empty when the same or either run
    did not record one): float bits differ across CPUs and kernel selections, so metric moves
    between two testbeds are not a commit's doing."""
    b, h = base_run.get("platform") or {}, head_run.get("platform") or {}
    if not b or not h:
        return []
    return [f"{k} {b.get(k)!r} -> {h.get(k)!r}" for k in TESTBED_KEYS if b.get(k) != h.get(k)]


def header_lines(cmp: Comparison) -> list[str]:
    lines = [f"base: {_run_label(cmp.base_run)}  head: {_run_label(cmp.head_run)}"]
    testbeds = platform_differences(cmp.base_run, cmp.head_run)
    if testbeds:
        lines.append(f"testbeds differ (metric moves may come from the machine, not the commit): {'; '.join(testbeds)}")
    stack_diffs = [d for d in cmp.version_diffs if d[0] != "tico"]
    tico_diffs = [d for d in cmp.version_diffs if d[0] == "tico"]
    if tico_diffs:
        lines.append(
            f"the tico under review differs from the base's, as a pull request makes it: "
            f"{describe_versions(tico_diffs)}"
        )
    if stack_diffs:
        lines.append(f"versions differ (compared anyway, --allow-version-mismatch): {describe_versions(stack_diffs)}")
    else:
        versions = cmp.head_run.get("versions") or {}
        pinned = ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "tico") if versions.get(k))
        lines.append(f"same stack: {pinned or 'versions not recorded'}")
    tico_base, tico_head = ((run.get("tico") or {}) for run in (cmp.base_run, cmp.head_run))
    if tico_base.get("source_sha256") != tico_head.get("source_sha256"):
        lines.append(f"tico under review: {describe(tico_head)}; base: {describe(tico_base)}")
    lines.append(
        f"{cmp.items_both} items in both runs ({cmp.items_base} in base, {cmp.items_head} in head); "
        f"{len(cmp.verdicts)} verdict change(s), {len(cmp.metrics)} metric move(s) beyond "
        f"{cmp.margin:.0%} (declared direction)"
    )
    lines.append(cmp.verdict_line())
    return lines


def render_text(cmp: Comparison) -> str:
    parts = header_lines(cmp)
    if cmp.verdicts:
        rows = [
            [
                v.kind.upper() if v.kind == WORSE else v.kind,
                v.nodeid,
                v.base or "-",
                v.head or "-",
                v.label,
                v.message[:100],
                v.repro,
            ]
            for v in cmp.verdicts
        ]
        parts += [
            "",
            "verdict changes:",
            tabulate(rows, headers=["", "item", "base", "head", "change", "message", "repro"], tablefmt="simple"),
        ]
    if cmp.metrics:
        rows = [
            [
                m.kind.upper() if m.kind == WORSE else m.kind,
                m.nodeid,
                m.metric,
                fmt(m.base),
                fmt(m.head),
                fmt_relative(m),
                f"{m.better} is better",
                m.repro,
            ]
            for m in cmp.metrics
        ]
        parts += [
            "",
            f"metric moves beyond {cmp.margin:.0%}:",
            tabulate(
                rows,
                headers=["", "item", "metric", "base", "head", "change", "direction", "repro"],
                tablefmt="simple",
                disable_numparse=True,
            ),
        ]
    if not cmp.verdicts and not cmp.metrics:
        parts += ["", "no item changed verdict and no declared metric moved beyond the margin"]
    parts += finding_lines(cmp)
    return "\n".join(parts)


def finding_lines(cmp: Comparison) -> list[str]:
    """What the head run's tico fixed, broke or left as it was, one line per finding."""

    rows = [row for row in compare_findings(cmp.base_run, cmp.head_run) if not row["change"].startswith("still")]
    if not rows:
        return []
    return ["", "findings:"] + [f"  {row['change']:<10} {row['id']} ({row['base']} -> {row['head']})" for row in rows]


def _md_text(value: Any) -> str:
    """Text for a markdown table cell: no raw HTML, no cell breaks, no line breaks."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;")  # no raw HTML; "->" stays readable
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_code(value: str) -> str:
    """An inline code span that survives backticks and pipes in the text."""
    value = value.replace("\n", " ").replace("|", "\\|")
    fence = "`"
    while fence in value:
        fence += "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def render_markdown(cmp: Comparison) -> str:
    lines = ["## wrapq: head vs base", ""]
    lines += [f"- {_md_text(line)}" for line in header_lines(cmp)[:-1]]
    lines += ["", f"**{_md_text(cmp.verdict_line())}**", ""]
    if cmp.verdicts:
        lines += ["### Verdict changes", "", "| | item | base | head | change | repro |", "|---|---|---|---|---|---|"]
        for v in cmp.verdicts:
            change = _md_text(v.label) + (f" -- {_md_text(v.message[:200])}" if v.message else "")
            lines.append(
                f"| {'**worse**' if v.kind == WORSE else v.kind} | {_md_code(v.nodeid)} | {v.base or '-'} | "
                f"{v.head or '-'} | {change} | {_md_code(v.repro)} |"
            )
        lines.append("")
    if cmp.metrics:
        lines += [
            f"### Metric moves beyond {cmp.margin:.0%}",
            "",
            "| | item | metric | base | head | change | repro |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in cmp.metrics:
            lines.append(
                f"| {'**worse**' if m.kind == WORSE else m.kind} | {_md_code(m.nodeid)} | "
                f"{_md_code(m.metric)} ({m.better} is better) | {fmt(m.base)} | {fmt(m.head)} | "
                f"{fmt_relative(m)} | {_md_code(m.repro)} |"
            )
        lines.append("")
    if not cmp.verdicts and not cmp.metrics:
        lines += ["No item changed verdict and no declared metric moved beyond the margin.", ""]
    return "\n".join(lines)


def render_html(cmp: Comparison) -> str:
    env = template_environment()
    env.filters["num"] = fmt
    env.filters["relative"] = fmt_relative
    return env.get_template("compare.html.j2").render(
        cmp=cmp, header=header_lines(cmp)[:-1], verdict=cmp.verdict_line(), worse=WORSE
    )
