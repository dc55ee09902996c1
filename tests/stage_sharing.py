"""The harness tests' in-process pipelines share torch.export programs and Circle conversions.

Many tests build a case's pipeline afresh (a clean run beside a defect, the same case in another
test of the process): the same adapter execution traced again, the same program converted by the
same code again. Within one test process, a program is kept under the export cache's execution key
and a conversion under the Circle cache's program key combined with the conversion code's
fingerprint (harness/export/execution_key.py, harness/export/circle_cache.py): the keys the caches
are tested sound with (tests/test_cache_soundness.py, tests/test_export_reuse.py), so a wrapper,
observer or pass patched in memory is a miss and is traced and converted cold. What the keys do not
walk (torch and the other libraries, patched) they do not see here either: a test that patches those
around a stage is marked ``fresh_stages``, as the tests of the caches themselves are. A failed stage is
never kept. Nested harness runs are separate processes and never share. ``WRAPQ_TESTS_FRESH_STAGES=1``
turns the sharing off (every stage traced and converted, as before it existed).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections import Counter
from typing import Any, Iterator

import harness.export.stages as stages
from harness.export.circle_cache import cache_key, conversion_code_fingerprint
from harness.export.entry_store import Uncacheable
from harness.export.execution_key import execution_key

_trace = stages.export_program
_convert = stages.convert_with_audit
_programs: dict[str, Any] = {}
_conversions: dict[tuple, tuple[bytes, Any]] = {}
served: Counter[str] = Counter()  # "export"/"convert" + " hit"/" miss"/" unkeyed", for the tests


def export_program(adapter: Any, args: tuple, measure_traced_code: bool = False) -> Any:
    if measure_traced_code:  # a measured run traces what it measures: nothing is shared
        return _trace(adapter, args, measure_traced_code)
    try:
        key = execution_key(adapter, args)
    except Uncacheable:
        served["export unkeyed"] += 1
        return _trace(adapter, args)
    if key in _programs:
        served["export hit"] += 1
        return copy.deepcopy(_programs[key])
    served["export miss"] += 1
    program = _trace(adapter, args)
    _programs[key] = copy.deepcopy(program)
    return program


def convert_with_audit(program: Any, *args: Any, **kwargs: Any) -> tuple[bytes, Any]:
    try:
        key = (cache_key(program), conversion_code_fingerprint(), args, tuple(sorted(kwargs.items())))
    except Uncacheable:
        served["convert unkeyed"] += 1
        return _convert(program, *args, **kwargs)
    if key in _conversions:
        served["convert hit"] += 1
        return copy.deepcopy(_conversions[key])
    served["convert miss"] += 1
    converted = _convert(program, *args, **kwargs)
    _conversions[key] = copy.deepcopy(converted)
    return converted


def _route(shared: bool) -> None:
    stages.export_program = export_program if shared else _trace
    stages.convert_with_audit = convert_with_audit if shared else _convert


def install() -> bool:
    """Route the pipelines' export and conversion stages through the shared ones; False when turned off."""
    shared = os.environ.get("WRAPQ_TESTS_FRESH_STAGES") != "1"
    _route(shared)
    return shared


@contextlib.contextmanager
def routed(shared: bool) -> Iterator[None]:
    """Shared (or fresh) stages for the duration, whatever the process was installed with."""
    previous = stages.export_program, stages.convert_with_audit
    _route(shared)
    try:
        yield
    finally:
        stages.export_program, stages.convert_with_audit = previous


def clear() -> None:
    _programs.clear()
    _conversions.clear()
    served.clear()
