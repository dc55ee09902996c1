"""Proof that a check left the shared pipeline artifacts as it found them.

Stages hand out shared objects (modules, tensors, samples); checks must not mutate them. A
snapshot records each shared tensor's in-place version counter and storage, module modes and
buffer names. Between ``start`` and ``end`` (one check), whatever changed outside stage work is
the check's doing; stage work itself (lazily built observers, new buffers) starts a new
baseline."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.model.case_parts import Built
from harness.records.overhead import overhead


class MutationGuard:
    def __init__(self, artifacts: Callable[[], dict[str, Any]]) -> None:
        self._artifacts = artifacts
        self._baseline: dict[tuple, Any] | None = None
        self._mutations: list[str] = []
        # The last snapshot taken, while nothing can have changed since (reused as a baseline).
        self._latest: dict[tuple, Any] | None = None

    # -- stage work, as the engine reports it ---------------------------------------------
    def stage_starts(self) -> None:
        if self._baseline is None:
            self._latest = None  # unwatched stage work may change artifacts: no reusable baseline
            return
        # Whatever changed since the last stage ended was done by the check itself.
        self._mutations += self._diff(self._baseline)

    def stage_ended(self) -> None:
        if self._baseline is not None:
            # Stage work may legitimately change modules (lazily built observers): new baseline.
            self._baseline = self._latest = self.snapshot()

    # -- one check ---------------------------------------------------------------------
    def start(self) -> None:
        """Start watching shared artifacts for changes made by a check (not by stages). The
        previous check's closing snapshot is the baseline when no stage ran unwatched since:
        between two checks of a case only the plugin's bookkeeping runs (one snapshot saved
        per item)."""
        self._baseline = self._latest if self._latest is not None else self.snapshot()
        self._mutations = []

    def end(self) -> list[str]:
        """Artifacts the check changed since ``start``, stage computations excluded."""
        mutations = list(self._mutations)
        if self._baseline is not None:
            mutations += self._diff(self._baseline)
        self._baseline, self._mutations = None, []
        return sorted(set(mutations))

    def mutated_since(self, before: dict[tuple, Any]) -> list[str]:
        return sorted(set(self._diff(before)))

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> dict[tuple, Any]:
        """Cheap fingerprint of every shared artifact: tensor version counters, modes, buffers."""
        with overhead("mutation_guard"):
            return self._snapshot()

    def _snapshot(self) -> dict[tuple, Any]:
        state: dict[tuple, Any] = {}

        def visit(prefix: str, value: Any) -> None:
            if isinstance(value, torch.Tensor):
                state[(prefix,)] = (value._version, value.data_ptr())
            elif isinstance(value, torch.nn.Module):
                # One pre-order walk over the module tree (this runs around every stage and
                # check): the module dicts directly, keys as tuples, formatted only when reported.
                modes, buffers = [], []
                stack, seen = [("", value)], set()
                while stack:
                    module_name, module = stack.pop()
                    if id(module) in seen:
                        continue
                    seen.add(id(module))
                    attrs = module.__dict__
                    modes.append(attrs.get("_mode"))
                    for name, t in attrs["_parameters"].items():
                        if t is not None:
                            state[(prefix, module_name, name)] = (t._version, t.data_ptr())
                    for name, t in attrs["_buffers"].items():
                        if t is not None:
                            key = (prefix, module_name, name)
                            state[key] = (t._version, t.data_ptr())
                            buffers.append(key)
                    children = [
                        (f"{module_name}.{child}" if module_name else child, m)
                        for child, m in attrs["_modules"].items()
                        if m is not None
                    ]
                    stack.extend(reversed(children))
                state[(prefix, "#modes")] = tuple(modes)
                state[(prefix, "#buffers")] = tuple(buffers)
            elif isinstance(value, Built):
                visit(f"{prefix}.module", value.module)
                for kind, samples in (
                    ("calibration", enumerate(value.inputs.calibration)),
                    ("evaluation", value.inputs.evaluation.items()),
                ):
                    for key, sample in samples:
                        for i, arg in enumerate(sample.args):
                            visit(f"{prefix}.{kind}[{key}].args[{i}]", arg)
                        for k, arg in sample.kwargs.items():
                            visit(f"{prefix}.{kind}[{key}].{k}", arg)

        for name, value in self._artifacts().items():
            visit(name, value)
        return state

    def _diff(self, before: dict[tuple, Any]) -> list[str]:
        after = self._latest = self.snapshot()
        return [
            ".".join(part for part in k if part).replace(".#", "#")
            for k, v in before.items()
            if k in after and after[k] != v
        ]
