"""Reading a reviewed entries file (acknowledged.toml, regression_policy.toml): one TOML (or JSON)
document holding a list of tables under one key. What is wrong is named with the file, in the
caller's own error type, so a typo never passes as "no entries"."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any


def entry_tables(data: Any, key: str, where: str, error: type[Exception]) -> list[Any]:
    """The raw entries under ``key`` (``[[key]]`` tables); anything else at the top level is an error."""
    if not isinstance(data, dict):
        raise error(f"{where}: expected a table with a '{key}' list")
    unknown = sorted(set(data) - {key})
    if unknown:
        raise error(f"{where}: unknown top-level key(s) {', '.join(unknown)}; entries go in [[{key}]]")
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise error(f"{where}: '{key}' must be a list of entries ([[{key}]] tables)")
    return entries


def read_document(path: Path, what: str, error: type[Exception]) -> Any:
    """The parsed .toml (or .json) file; missing, non-UTF-8 or unparsable is ``error``."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: cannot be parsed: {exc}") from None


def check_fields(raw: Any, fields: set[str] | frozenset[str], label: str, error: type[Exception]) -> dict[str, Any]:
    """One entry as a table of known fields (``label`` names it in the error)."""
    if not isinstance(raw, dict):
        raise error(f"{label} is not a table of fields")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise error(f"{label}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(sorted(fields))})")
    return raw
