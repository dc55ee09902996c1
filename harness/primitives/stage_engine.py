"""Lazily computed, memoised, timed stages, each run at most once per process.

A stage that raises is remembered as a StageError and re-raised to every caller that needs it,
so a crashing wrapper fails the items that need that stage, with the stage named, and nothing
else. The outermost stage arms the per-stage time limit. A mutation guard, when one watches,
is told where stage work starts and ends, so what a check changes is told apart from what
stages build."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import torch

from harness.primitives.mutation_guard import MutationGuard


class StageTimeout(Exception):
    """Raised inside a stage that ran past the per-stage time limit."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """SIGALRM-based limit for the main thread (pytest and xdist workers run tests there).
    Interrupts Python-level hangs; nested limits are not supported (stages do not nest timers)."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise StageTimeout(f"exceeded the per-stage limit of {seconds:g} s (--stage-timeout)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ReplayedFailure(Exception):
    """Raised where a cache holds a recorded failure for this key (harness/export/failure_replay.py): the
    stage engine turns it into the StageError the original failure produced (same stage, type and
    message). ``recorded`` is the failure_replay.RecordedFailure."""

    def __init__(self, recorded: Any, source: str) -> None:
        self.recorded = recorded
        self.source = source
        super().__init__(f"{recorded.error_type}: {recorded.message} (replayed from {source})")


class StageError(RuntimeError):
    """A pipeline stage failed; carries the stage name and the original traceback text."""

    def __init__(self, case: str, profile: str, stage: str, error: BaseException):
        self.replayed_from: str | None = None
        if isinstance(error, ReplayedFailure):
            # A cache replays a failure the same input and code produced: the same stage, type
            # and message as then, so the same items fail the same way (harness/export/failure_replay.py).
            recorded = error.recorded
            self.stage, self.error_type, self.error_text = recorded.stage, recorded.error_type, recorded.message
            self.traceback_text = (
                f"{recorded.traceback}\n(replayed from {error.source}: the same input "
                f"and code failed this way when the entry was written)"
            )
            self.replayed_from = error.source
        else:
            self.stage = stage
            self.error_type = type(error).__name__
            self.error_text = str(error)
            self.traceback_text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        super().__init__(f"{case}[{profile}]: stage '{self.stage}' failed: {self.error_type}: {self.error_text}")


class StageObserver(Protocol):
    """Told of every stage asked for (memo hits included) and of where each computation starts and
    ends (``--tico-coverage`` labels what tico runs inside a stage with that stage)."""

    def requested(self, name: str) -> None: ...

    def entered(self, name: str) -> None: ...

    def left(self, name: str) -> None: ...


_observers: list[StageObserver] = []


def observe_stages(observer: StageObserver | None) -> None:
    """Install (or, with None, remove) the process's stage observer."""
    _observers[:] = [observer] if observer is not None else []


class StageEngine:
    """The memo, timings and failure record of one (case, profile)'s stages."""

    def __init__(self, case_name: str, profile: str, stage_timeout: float | None) -> None:
        self._label = (case_name, profile)
        self._stage_timeout = stage_timeout
        self.timings: dict[str, float] = {}
        self._values: dict[str, Any] = {}
        self._errors: dict[str, StageError] = {}
        self._running: list[str] = []
        self.guard = MutationGuard(lambda: self._values)

    def _stage(self, name: str, compute: Callable[[], Any]) -> Any:
        for observer in _observers:
            observer.requested(name)
        if name in self._values:
            return self._values[name]
        if name in self._errors:
            raise self._errors[name]
        outermost = not self._running
        if outermost:
            self.guard.stage_starts()
        start = time.perf_counter()
        self._running.append(name)
        for observer in _observers:
            observer.entered(name)
        try:
            # Only the outermost stage arms the timer; inner stages it computes share its budget.
            with torch.no_grad(), time_limit(self._stage_timeout if outermost else None):
                self._values[name] = compute()
        except StageError as upstream:
            # A dependency failed: remember it under this name too, without re-running.
            self._errors[name] = upstream
            raise
        except Exception as exc:  # noqa: BLE001 - any wrapper crash becomes a named stage failure
            err = StageError(*self._label, name, exc)
            self._errors[name] = err
            raise err from exc
        finally:
            for observer in _observers:
                observer.left(name)
            self._running.pop()
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
            if outermost:
                self.guard.stage_ended()
        return self._values[name]

    # the guard, as the items call it
    def guard_start(self) -> None:
        self.guard.start()

    def guard_end(self) -> list[str]:
        return self.guard.end()

    def snapshot(self) -> dict[tuple, Any]:
        return self.guard.snapshot()

    def mutated_since(self, before: dict[tuple, Any]) -> list[str]:
        return self.guard.mutated_since(before)
