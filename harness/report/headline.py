"""Headline metrics: the numbers each check declares worth a column (``Metric(headline=True)``),
read from the check declarations results.json carries, so the terminal summary and the HTML
overview list what the checks say, not a list of names of their own."""

from __future__ import annotations

from typing import Any, Mapping


def headline_columns(checks: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(check, metric name, column label) for every headline metric, in check-name order."""
    columns = []
    for check_name in sorted(checks):
        for metric in checks[check_name].get("metrics") or []:
            if metric.get("headline") and "*" not in metric["name"]:
                columns.append((check_name, metric["name"], metric.get("label") or metric["name"]))
    return columns


def headline_values(records: Mapping[str, Mapping[str, Any]], columns: list[tuple[str, str, str]]) -> list[Any]:
    """The values of ``columns`` from one (case, profile)'s records (check -> record)."""
    return [((records.get(check) or {}).get("metrics") or {}).get(metric) for check, metric, _ in columns]
