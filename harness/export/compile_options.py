"""The options of tico's conversion (its ``CompileConfig``) a case converts with.

Users pass them to ``tico.convert(..., config=...)``; a case declares the non-default ones as data
(``Case.compile_options``, a sweep axis like any other). tico's config takes any name silently
(``set`` adds an attribute, ``from_dict`` drops an unknown key), so a misspelt option would convert
with the defaults: the names are checked against the config's own fields here, before converting.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


class UnknownCompileOption(ValueError):
    """A case names an option tico's conversion config does not have."""


def tico_config(options: Mapping[str, bool]) -> Any:
    """tico's default conversion config with ``options`` set; refuses a name the config lacks."""
    from tico.config import get_default_config

    config = get_default_config()
    known = config.to_dict()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UnknownCompileOption(
            f"unknown tico compile option(s) {unknown}: {type(config).__name__} has {sorted(known)}"
        )
    for name, value in options.items():
        if not isinstance(value, bool):
            raise UnknownCompileOption(f"compile option {name!r} must be True or False, got {value!r}")
        config.set(name, value)
    return config


def options_key(program_key: str, options: Mapping[str, bool]) -> str:
    """The Circle cache key of a program converted with ``options``: the program's own key when there are
    none (the default conversion keeps its entries), else a key of both."""
    if not options:
        return program_key
    text = f"{program_key}\n{json.dumps(dict(options), sort_keys=True)}"
    return hashlib.sha256(text.encode()).hexdigest()


def describe(options: Mapping[str, bool]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(options.items())) or "tico's defaults"
