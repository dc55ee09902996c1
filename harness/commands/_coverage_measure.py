"""Measure wrapper coverage by running cases (``python -m harness wrappers --measure``): each tiny
case built, quantized and evaluated in this process, as the plugin does, no export."""

from __future__ import annotations

from typing import Any, Iterable

from harness.model.case_loading import add_configured_import_roots, load_cases
from harness.pipeline import Pipeline, StageError, warm_imports
from harness.tico_facts.wrapper_coverage import SNAPSHOT_PROFILE


def measure_case(case: Any, profile: str = SNAPSHOT_PROFILE) -> dict[str, Any]:
    """Build, quantize and evaluate one case in this process (no export), as the plugin does."""
    warm_imports()
    reason = case.unavailable_reason()
    if reason:
        return {"error": f"case unavailable: {reason}"}
    pipeline = Pipeline(case, profile)
    try:
        return pipeline.wrapper_coverage
    except StageError as err:
        return {"error": str(err)}


def measure_all(case_names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    add_configured_import_roots()
    wanted = set(case_names) if case_names is not None else None
    out = {}
    for _, case in load_cases():
        if SNAPSHOT_PROFILE in case.profiles and (wanted is None or case.name in wanted):
            out[case.name] = measure_case(case)
    if wanted is not None and wanted - set(out):
        raise KeyError(f"no tiny case named {', '.join(sorted(wanted - set(out)))}")
    return dict(sorted(out.items()))
