"""A check's settings for one (case, profile): the check's defaults, then the case's overrides
(``Case.settings[check]``), then the profile's (``ProfileLimits.settings[check]``).

Overrides are plain mappings of field -> value, validated against the check's settings
dataclass when the case file is collected, so a typo or a wrong type fails that case's
definition item instead of being ignored."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from harness.model.case import Case, CaseDefinitionError


def overrides_for(case: Case, check_name: str, profile: str) -> dict[str, Any]:
    merged = dict(case.settings.get(check_name) or {})
    limits = case.profile_limits.get(profile)
    if limits is not None:
        merged.update(limits.settings.get(check_name) or {})
    return merged


def resolve(check: Any, case: Case, profile: str) -> Any:
    """The check's settings instance for this case and profile."""
    if check.settings is None:
        raise TypeError(f"check {check.name!r} declares no settings")
    return dataclasses.replace(check.settings(), **overrides_for(case, check.name, profile))


def _type_text(annotation: Any) -> str:
    """A settings field's annotation as text ("float | None"), whether or not the check module
    uses ``from __future__ import annotations``."""
    if isinstance(annotation, str):
        text = annotation
    elif isinstance(annotation, type):
        text = annotation.__name__
    else:
        text = str(annotation)
    return text.replace(" ", "").replace("typing.", "").replace("Optional[float]", "float|None")


def _field_problem(field: dataclasses.Field, value: Any) -> str | None:
    text = _type_text(field.type)
    optional = "None" in text.split("|")
    base = set(text.split("|")) - {"None"}
    if value is None:
        return None if optional else "must not be None"
    if base <= {"float", "int"}:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number{' or None' if optional else ''}, got {type(value).__name__} {value!r}"
    elif base == {"bool"} and not isinstance(value, bool):
        return f"must be a bool, got {type(value).__name__} {value!r}"
    elif base == {"str"} and not isinstance(value, str):
        return f"must be a string, got {type(value).__name__} {value!r}"
    return None


def validate(case: Case, checks: Iterable[Any]) -> list[CaseDefinitionError]:
    """Every settings override names a check with settings and fields that exist, typed right."""
    by_name = {check.name: check for check in checks}
    sources = [("settings", case.settings)] + [
        (f"profile_limits[{profile!r}].settings", limits.settings) for profile, limits in case.profile_limits.items()
    ]
    errors = []
    for where, mapping in sources:
        for check_name, overrides in mapping.items():
            check = by_name.get(check_name)
            if check is None:
                errors.append(
                    CaseDefinitionError(
                        case.name, where, f"names no check: {check_name} (checks: {', '.join(sorted(by_name))})"
                    )
                )
                continue
            if check.settings is None:
                errors.append(CaseDefinitionError(case.name, f"{where}[{check_name!r}]", "the check has no settings"))
                continue
            fields = {f.name: f for f in dataclasses.fields(check.settings)}
            if not isinstance(overrides, Mapping):
                errors.append(
                    CaseDefinitionError(
                        case.name,
                        f"{where}[{check_name!r}]",
                        f"must map field names to values, got {type(overrides).__name__}",
                    )
                )
                continue
            for key, value in overrides.items():
                if key not in fields:
                    errors.append(
                        CaseDefinitionError(
                            case.name,
                            f"{where}[{check_name!r}]",
                            f"{check_name} has no setting {key!r} (settings: {', '.join(fields)})",
                        )
                    )
                    continue
                problem = _field_problem(fields[key], value)
                if problem:
                    errors.append(CaseDefinitionError(case.name, f"{where}[{check_name!r}].{key}", problem))
    return errors


def merged(base: Mapping[str, Mapping[str, Any]], **by_check: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``base`` settings with some checks' fields replaced: ``merged(OTHER.settings,
    quant_accuracy={"max_peir": 0.2})`` keeps every other field and check as they are."""
    out = {name: dict(values) for name, values in base.items()}
    for name, values in by_check.items():
        out[name] = {**out.get(name, {}), **values}
    return out


__all__ = ["merged", "overrides_for", "resolve", "validate"]
