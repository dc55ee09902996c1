"""Which cached result may stand in for a fresh one, in one place.

Two caches sit in front of the costliest stages: the export cache (harness/export/export_reuse.py)
answers "what would torch.export produce" when the adapter executes exactly as before, and the
Circle cache (harness/export/circle_cache.py) answers "what would tico's conversion produce" for the
same program converted by the same code (harness/export/code_fingerprint.py). Neither is consulted
when its directory is off (``--no-export-cache`` / ``--no-circle-cache``), a key that cannot be
computed is a miss with the reason recorded, and a disk that cannot store an entry costs the
reuse, never the case. A reproducible failure of the export or the conversion is kept under the
key a success would have had and replayed as the same stage failure (harness/export/failure_replay.py)."""

from __future__ import annotations

from typing import Any

from harness.export.circle_cache import CircleCache, cache_key
from harness.export.entry_store import Uncacheable
from harness.export.execution_key import execution_key
from harness.export.export_reuse import ExportCache, record_from_program
from harness.export.failure_replay import RecordedFailure, ReplayedFailure, keep, record_stage_error
from harness.export.stages import convert_to_circle
from harness.primitives.stage_engine import StageError


def export_record(pipeline: Any) -> Any:
    """The export record of ``pipeline``'s export sample: reused on an execution-key hit, else
    read off a fresh torch.export program (and stored)."""

    name = pipeline.export_sample_name
    adapter = pipeline.export_adapter("quant", name)
    args = pipeline.case.export.args(pipeline.sample(name))
    settings = pipeline.settings
    cache = ExportCache(settings.export_cache_dir) if settings.export_cache_dir else None
    key, status, notes = None, "off", []
    if cache is not None:
        try:
            key = execution_key(adapter, args)
        except Uncacheable as why:
            status = f"uncacheable: {why}"
        else:
            record, notes = cache.get(key)
            if isinstance(record, RecordedFailure):
                raise ReplayedFailure(record, f"the export cache entry {key[:12]}")
            if record is not None:
                record.status, record.notes = "hit", notes
                return record
    try:
        program = pipeline.exported_program
    except StageError as err:  # the same execution exported by the same code fails the same way
        keep(cache, key, record_stage_error(err))
        raise
    circle_key = None
    if settings.circle_cache_dir is not None:
        try:
            circle_key = cache_key(program)
        except Uncacheable:
            pass  # the Circle stage converts it and says why
    record = record_from_program(program, args, circle_key)
    if key is not None:
        try:
            cache.put(key, record)
            status = "miss"
        except Uncacheable as why:
            status = f"uncacheable: {why}"
        except OSError as why:  # a full or read-only disk costs the reuse, not the case
            status = f"not stored: {why}"
    record.status, record.notes = status, notes
    return record


def circle_artifact(pipeline: Any) -> Any:
    """tico's conversion of the exported program, or the Circle cache's entry for it."""

    cache_dir = pipeline.settings.circle_cache_dir
    cache = CircleCache(cache_dir) if cache_dir else None
    record = pipeline.export_record if cache is not None else None
    if record is not None and record.status == "hit":
        # The reused record names its program's Circle key: a hit needs no trace.
        return convert_to_circle(lambda: pipeline.exported_program, cache, reused_key=record.circle_key)
    # the record's key was computed from this very program
    return convert_to_circle(
        lambda: pipeline.exported_program, cache, key=record.circle_key if record is not None else None
    )
