"""A stage failure that the same input and the same code reproduce, stored in a cache entry and
replayed on a hit.

tico refusing a graph (an operator it cannot convert) and torch.export refusing an adapter are
as deterministic as a successful conversion or export: same program (or same execution), same
code, same error. Without this, such a case pays for the failing export or conversion on every
warm run. A replay gives the verdict a cold run gives: the item fails (or is an expected
failure) with the same stage name, error type and message -- the stage-problem line
expectations match -- and its traceback says which cache entry replayed it.

What is never recorded, because it says something about the machine or the moment, not about
the input: a stage timeout, running out of memory or recursion depth, an OS error, an interrupt.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

from harness.export.entry_store import Uncacheable
from harness.primitives.stage_engine import ReplayedFailure, StageTimeout  # noqa: F401 - ReplayedFailure re-exported

# Failures that depend on the machine or the moment, not on the program and the code.
NOT_REPRODUCIBLE = (StageTimeout, MemoryError, RecursionError, OSError, KeyboardInterrupt, SystemExit)
FAILURE_SCHEMA = "stage-failure-v1"


@dataclasses.dataclass(frozen=True)
class RecordedFailure:
    """What a failed stage said: enough to fail the same items the same way."""

    stage: str
    error_type: str
    message: str
    traceback: str

    def manifest(self) -> dict[str, Any]:
        return {"schema": FAILURE_SCHEMA, **dataclasses.asdict(self)}

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> "RecordedFailure":
        if data.get("schema") != FAILURE_SCHEMA:
            raise ValueError(f"stage failure of schema {data.get('schema')!r}, expected {FAILURE_SCHEMA!r}")
        return cls(
            stage=str(data["stage"]),
            error_type=str(data["error_type"]),
            message=str(data["message"]),
            traceback=str(data["traceback"]),
        )


def reproducible(error: BaseException) -> bool:
    """Whether ``error`` (a stage's own exception, not the StageError wrapping it) follows from
    the input and the code alone. The whole chain is looked at: dynamo and tico re-raise what
    they catch as their own errors, so a timeout or a MemoryError inside torch.export arrives
    wrapped, and must not be kept as if the program were refused."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        if isinstance(link, NOT_REPRODUCIBLE) or not isinstance(link, Exception):
            return False
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return True


def record(stage: str, error: BaseException) -> RecordedFailure | None:
    """The failure to store, or None when it must not be replayed."""
    if not reproducible(error):
        return None
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return RecordedFailure(stage=stage, error_type=type(error).__name__, message=str(error), traceback=text)


def record_stage_error(err: Any) -> RecordedFailure | None:
    """The failure behind a StageError (its ``__cause__`` is the stage's own exception), or
    None when there is none or it must not be replayed. A StageError that is itself a replay
    is recorded as it was first recorded."""
    if isinstance(err.__cause__, ReplayedFailure):
        return err.__cause__.recorded
    cause = err.__cause__
    if cause is None or not reproducible(cause):
        return None
    return RecordedFailure(
        stage=err.stage, error_type=err.error_type, message=err.error_text, traceback=err.traceback_text
    )


def keep(store: Any, key: str | None, failure: RecordedFailure | None) -> None:
    """Store ``failure`` under ``key`` with ``store.put_failure`` when there is one to keep; one
    that cannot be stored (a full or read-only disk, an entry the cache cannot describe) costs
    the reuse only: the next run redoes the work."""
    if key is None or failure is None:
        return
    try:
        store.put_failure(key, failure)
    except (Uncacheable, OSError):
        pass
