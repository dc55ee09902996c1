"""Lazily computed, memoised, timed stages for one (case, profile) in one worker process.

reference -> wrapped (NO_QUANT) -> quantized (prepare, calibrate, convert) -> outputs -> export
adapters. Each stage runs at most once per worker however many checks ask for it. A stage
that raises is remembered as a StageError and re-raised to every check that needs it, so a
crashing wrapper fails that case's items with the stage named, and nothing else.

Stages hand out shared objects; checks must not mutate them. ``snapshot()`` records each
shared tensor's in-place version counter, module modes and buffer names so the runner can
prove a check left them as it found them.
"""

from __future__ import annotations

import copy
import signal
import threading
from contextlib import contextmanager
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from harness.case import Built, Case, Sample
from harness.overhead import overhead


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


class StageError(RuntimeError):
    """A pipeline stage failed; carries the stage name and the original traceback text."""

    def __init__(self, case: str, profile: str, stage: str, error: BaseException):
        self.stage = stage
        self.error_type = type(error).__name__
        self.error_text = str(error)
        self.traceback_text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        super().__init__(f"{case}[{profile}]: stage '{stage}' failed: {self.error_type}: {error}")


def set_seed(seed: int) -> None:
    """Seed every RNG a builder may touch, so reference weights and inputs are reproducible."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def wrap_noquant(case: Case, module: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """The wrapper tree in NO_QUANT mode, as tico constructs it (no calibration enabled)."""
    if case.wrap is not None:
        return case.wrap(module, cfg)
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper

    return PTQWrapHelper(strict_wrap=bool(getattr(cfg, "strict_wrap", True))).wrap_supported(module, cfg)


def top_quant_modules(root: torch.nn.Module) -> list[Any]:
    """The outermost quant modules of a tree (the root itself when it is one)."""
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    if isinstance(root, QuantModuleBase):
        return [root]
    found, inner = [], set()
    for module in root.modules():
        if isinstance(module, QuantModuleBase) and id(module) not in inner:
            found.append(module)
            inner.update(id(m) for m in module.modules())
    return found


def enable_calibration(root: torch.nn.Module) -> None:
    for module in top_quant_modules(root):
        module.enable_calibration()


def freeze_qparams(root: torch.nn.Module) -> None:
    for module in top_quant_modules(root):
        module.freeze_qparams()


def unwrap(root: torch.nn.Module) -> torch.nn.Module:
    """The case-level wrapper inside tico's PTQWrapper shell (or the module itself)."""
    return getattr(root, "wrapped", root)


@dataclass(frozen=True)
class RunSettings:
    """Session options checks may need (where goldens live, whether to rewrite them)."""

    golden_dir: Path = Path("golden")
    update_golden: bool = False
    stage_timeout: float | None = None
    # content-addressed ExportedProgram -> Circle cache directory (None: always convert)
    circle_cache_dir: Path | None = None
    # torch.export reuse keyed by the adapter's execution (None: always trace)
    export_cache_dir: Path | None = None


class Pipeline:
    """Artifacts of one (case, profile). Construct via ``PipelineCache.get``."""

    def __init__(self, case: Case, profile: str, artifact_dir: Path | None = None, settings: RunSettings | None = None):
        self.case = case
        self.profile = profile
        self.artifact_dir = artifact_dir
        self.settings = settings or RunSettings()
        # pytest node id of this (case, profile), set by the plugin; used in printed commands.
        self.nodeid = f"{case.name}[{profile}]"
        self.timings: dict[str, float] = {}
        self._values: dict[str, Any] = {}
        self._errors: dict[str, StageError] = {}
        self._running: list[str] = []
        self._guard: dict[tuple, Any] | None = None
        self._guard_mutations: list[str] = []
        # The last snapshot taken, while nothing can have changed since (reused as a baseline).
        self._latest: dict[tuple, Any] | None = None
        # id() of every module of the quantized tree whose forward ran in a QUANT evaluation
        # (harness.wrapper_coverage: which registered wrappers a case exercises).
        self._quant_ran: set[int] = set()

    @property
    def thresholds(self) -> Any:
        """The limits that gate this profile (the case's own, or its profile_limits entry)."""
        return self.case.thresholds_for(self.profile)

    # -- stage machinery -------------------------------------------------
    def _stage(self, name: str, compute: Callable[[], Any]) -> Any:
        if name in self._values:
            return self._values[name]
        if name in self._errors:
            raise self._errors[name]
        outermost = not self._running
        guarded = outermost and self._guard is not None
        if not guarded:
            self._latest = None  # unwatched stage work may change artifacts: no reusable baseline
        if guarded:
            # Whatever changed since the last stage ended was done by the check itself.
            self._guard_mutations += self._diff(self._guard)
        start = time.perf_counter()
        self._running.append(name)
        try:
            # Only the outermost stage arms the timer; inner stages it computes share its budget.
            with torch.no_grad(), time_limit(self.settings.stage_timeout if outermost else None):
                self._values[name] = compute()
        except StageError as upstream:
            # A dependency failed: remember it under this name too, without re-running.
            self._errors[name] = upstream
            raise
        except Exception as exc:  # noqa: BLE001 - any wrapper crash becomes a named stage failure
            err = StageError(self.case.name, self.profile, name, exc)
            self._errors[name] = err
            raise err from exc
        finally:
            self._running.pop()
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
            if guarded:
                # Stage work may legitimately change modules (lazily built observers): new baseline.
                self._guard = self._latest = self.snapshot()
        return self._values[name]

    # -- stages ------------------------------------------------------------
    @property
    def built(self) -> Built:
        def compute() -> Built:
            set_seed(self.case.seed)
            built = self.case.build(self.profile)
            if not isinstance(built, Built):
                raise TypeError(f"build() must return harness.Built, got {type(built).__name__}")
            built.module.eval()
            return built

        return self._stage("reference", compute)

    @property
    def ptq_config(self) -> Any:
        return self._stage("ptq_config", lambda: self.case.ptq_config(self.profile))

    @property
    def wrapped(self) -> torch.nn.Module:
        """The wrapper tree in NO_QUANT mode, as tico constructs it (no calibration enabled)."""

        def compute() -> torch.nn.Module:
            return wrap_noquant(self.case, copy.deepcopy(self.built.module), self.ptq_config).eval()

        return self._stage("wrap", compute)

    @property
    def quantized(self) -> torch.nn.Module:
        """The public PTQ flow on a private copy: prepare -> calibrate -> convert."""

        def compute() -> torch.nn.Module:
            from tico.quantization import convert, prepare

            built, cfg = self.built, self.ptq_config
            do_prepare = self.case.prepare or (lambda module, c: prepare(module, c, inplace=True))
            do_convert = self.case.convert or (lambda module: convert(module, inplace=True))
            prepared = self._stage("prepare", lambda: do_prepare(copy.deepcopy(built.module), cfg))

            def calibrate() -> None:
                for sample in built.inputs.calibration:
                    sample.call(prepared)

            self._stage("calibrate", calibrate)
            return self._stage("convert", lambda: do_convert(prepared).eval())

        return self._stage("quantized", compute)

    def output(self, which: str, sample_name: str) -> torch.Tensor:
        """Output tensor of 'reference', 'noquant' or 'quant' for an evaluation sample."""
        modules = {
            "reference": lambda: self.built.module,
            "noquant": lambda: self.wrapped,
            "quant": lambda: self.quantized,
        }
        sample = self.sample(sample_name)
        reference_call = self.case.reference_call
        if which == "reference" and reference_call is not None:
            run = lambda: reference_call(self.built.module, sample)  # noqa: E731
        elif which == "quant":
            run = lambda: self._run_quant(sample)  # noqa: E731
        else:
            run = lambda: sample.call(modules[which]())  # noqa: E731
        return self._stage(f"{which}_output[{sample_name}]", lambda: self.case.output(run()).detach())

    def _run_quant(self, sample: Sample) -> Any:
        """The QUANT evaluation call, recording which modules of the tree ran a forward."""
        from harness.wrapper_coverage import record_forwards

        model = self.quantized  # built outside the recorder: prepare/calibrate forwards do not count
        with record_forwards(self._quant_ran):
            return sample.call(model)

    @property
    def wrapper_coverage(self) -> dict[str, Any]:
        """Registered wrappers instantiated in the quantized tree and those that ran a forward on
        the evaluation samples in QUANT mode (``harness.wrapper_coverage.measure``). Reuses the
        QUANT outputs the checks computed; computes the ones no check needed."""

        def compute() -> dict[str, Any]:
            from harness.wrapper_coverage import measure

            start = time.perf_counter()
            failed = {}
            for name in self.built.inputs.evaluation:
                try:
                    self.output("quant", name)
                except StageError as err:  # what ran before the failure still counts; the failure is said
                    failed[name] = str(err)
            record = measure(self.quantized, self._quant_ran, reference=self.built.module)
            record["samples"] = sorted(self.built.inputs.evaluation)
            if failed:
                record["failed_samples"] = failed
            record["seconds"] = round(time.perf_counter() - start, 4)
            return record

        return self._stage("wrapper_coverage", compute)

    def sample(self, sample_name: str) -> Sample:
        samples = self.built.inputs.evaluation
        if sample_name not in samples:
            raise KeyError(f"case {self.case.name!r} has no evaluation sample {sample_name!r}; has {sorted(samples)}")
        return samples[sample_name]

    def export_adapter(self, mode: str, sample_name: str) -> torch.nn.Module:
        """Static export adapter over a private copy of the 'noquant' or 'quant' model."""
        export = self.case.export
        if export is None:
            raise RuntimeError(f"case {self.case.name!r} declares no export capability")
        source = {"noquant": lambda: self.wrapped, "quant": lambda: self.quantized}[mode]
        sample = self.sample(sample_name)
        return self._stage(
            f"export_adapter[{mode},{sample_name}]",
            lambda: export.adapter(copy.deepcopy(source()), sample, self.built).eval(),
        )

    def export_raw_output(self, mode: str, sample_name: str) -> Any:
        """The export adapter's output as it returns it (every output, e.g. hidden + K/V)."""
        export = self.case.export
        assert export is not None
        sample = self.sample(sample_name)
        return self._stage(
            f"export_raw_output[{mode},{sample_name}]",
            lambda: self.export_adapter(mode, sample_name)(*export.args(sample)),
        )

    def export_output(self, mode: str, sample_name: str) -> torch.Tensor:
        return self._stage(
            f"export_output[{mode},{sample_name}]",
            lambda: self.case.output(self.export_raw_output(mode, sample_name)).detach(),
        )

    def export_output_leaves(self, mode: str, sample_name: str) -> list[torch.Tensor]:
        """Every tensor the adapter returns, in the order torch.export (and Circle) flatten them."""
        leaves, _ = torch.utils._pytree.tree_flatten(self.export_raw_output(mode, sample_name))
        return [leaf.detach() for leaf in leaves if isinstance(leaf, torch.Tensor)]

    # -- export once: torch.export -> Circle -> replay ------------------------------
    @property
    def export_sample_name(self) -> str:
        """The deployment profile that is exported (the first sample the case names)."""
        assert self.case.export is not None
        return self.case.export.samples[0]

    @property
    def exported_program(self) -> Any:
        """torch.export of the QUANT export adapter, once per case; feeds every export check."""
        from harness.export import export_program

        name = self.export_sample_name
        return self._stage(
            "torch_export",
            lambda: export_program(self.export_adapter("quant", name), self.case.export.args(self.sample(name))),
        )

    @property
    def export_record(self) -> Any:
        """What the export checks read from the torch.export program: its output on the export
        sample, graph facts and Circle cache key. Reused from the export cache when the
        adapter's execution key matches (torch.export does not run); traced otherwise."""
        from harness.circle_cache import Uncacheable, cache_key
        from harness.export_reuse import ExportCache, execution_key, record_from_program

        name = self.export_sample_name

        def compute() -> Any:
            adapter = self.export_adapter("quant", name)
            args = self.case.export.args(self.sample(name))
            cache = ExportCache(self.settings.export_cache_dir) if self.settings.export_cache_dir else None
            key, status, notes = None, "off", []
            if cache is not None:
                try:
                    key = execution_key(adapter, args)
                except Uncacheable as why:
                    status = f"uncacheable: {why}"
                else:
                    record, notes = cache.get(key)
                    if record is not None:
                        record.status, record.notes = "hit", notes
                        return record
            program = self.exported_program
            circle_key = None
            if self.settings.circle_cache_dir is not None:
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

        return self._stage("export_record", compute)

    def exported_program_output(self) -> torch.Tensor:
        return self._stage(
            "torch_export_output",
            lambda: self.case.output(self.export_record.output()).detach(),
        )

    @property
    def circle(self) -> Any:
        """tico's Circle conversion of the exported program (kept as a .circle artifact)."""
        from harness.export import convert_to_circle

        def compute() -> Any:
            from harness.circle_cache import CircleCache

            cache_dir = self.settings.circle_cache_dir
            cache = CircleCache(cache_dir) if cache_dir else None
            record = self.export_record if cache is not None else None
            if record is not None and record.status == "hit":
                # The reused record names its program's Circle key: a hit needs no trace.
                artifact = convert_to_circle(lambda: self.exported_program, cache, reused_key=record.circle_key)
            else:  # the record's key was computed from this very program
                artifact = convert_to_circle(lambda: self.exported_program, cache,
                                             key=record.circle_key if record is not None else None)
            if self.artifact_dir is not None:
                self.artifact_dir.mkdir(parents=True, exist_ok=True)
                path = self.artifact_dir / f"{self.case.name}[{self.profile}].q.circle"
                path.write_bytes(artifact.binary)
                artifact.path = str(path)
            return artifact

        return self._stage("circle_convert", compute)

    def circle_outputs(self, mode: str) -> list[torch.Tensor]:
        """Every Circle replay output ('fake_quantize' or 'native'), each shaped like the torch
        export output it corresponds to (same flattened order)."""
        from harness.export import replay_circle

        sample = self.sample(self.export_sample_name)

        def compute() -> list[torch.Tensor]:
            outputs = replay_circle(self.circle, self.case.export.args(sample), mode)
            references = self.export_output_leaves("quant", self.export_sample_name)
            if len(outputs) != len(references):
                raise ValueError(f"the Circle model has {len(outputs)} outputs, the export adapter returns "
                                 f"{len(references)} tensors")
            return [torch.from_numpy(np.asarray(out)).reshape(ref.shape) for out, ref in zip(outputs, references)]

        return self._stage(f"circle_replay[{mode}]", compute)

    # -- immutability guard -------------------------------------------------
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
                    children = [(f"{module_name}.{child}" if module_name else child, m)
                                for child, m in attrs["_modules"].items() if m is not None]
                    stack.extend(reversed(children))
                state[(prefix, "#modes")] = tuple(modes)
                state[(prefix, "#buffers")] = tuple(buffers)
            elif isinstance(value, Built):
                visit(f"{prefix}.module", value.module)
                for kind, samples in (("calibration", enumerate(value.inputs.calibration)),
                                      ("evaluation", value.inputs.evaluation.items())):
                    for key, sample in samples:
                        for i, arg in enumerate(sample.args):
                            visit(f"{prefix}.{kind}[{key}].args[{i}]", arg)
                        for k, arg in sample.kwargs.items():
                            visit(f"{prefix}.{kind}[{key}].{k}", arg)

        for name, value in self._values.items():
            visit(name, value)
        return state

    def _diff(self, before: dict[tuple, Any]) -> list[str]:
        after = self._latest = self.snapshot()
        return [".".join(part for part in k if part).replace(".#", "#") for k, v in before.items()
                if k in after and after[k] != v]

    def mutated_since(self, before: dict[str, Any]) -> list[str]:
        return sorted(set(self._diff(before)))

    def guard_start(self) -> None:
        """Start watching shared artifacts for changes made by a check (not by stages). The
        previous check's closing snapshot is the baseline when no stage ran unwatched since:
        between two checks of a case only the plugin's bookkeeping runs (one snapshot saved
        per item)."""
        self._guard = self._latest if self._latest is not None else self.snapshot()
        self._guard_mutations = []

    def guard_end(self) -> list[str]:
        """Artifacts the check changed since guard_start, stage computations excluded."""
        mutations = list(self._guard_mutations)
        if self._guard is not None:
            mutations += self._diff(self._guard)
        self._guard, self._guard_mutations = None, []
        return sorted(set(mutations))


def warm_imports() -> None:
    """Import tico's wrapper registry (which imports transformers) before any stage timer is
    armed: a timeout that interrupts a half-done import would poison the registry for every
    later case in the process."""
    from tico.quantization import convert, prepare  # noqa: F401
    from tico.quantization.wrapq.wrap_helper import PTQWrapHelper  # noqa: F401
    from tico.quantization.wrapq.wrappers.registry import lookup

    lookup(torch.nn.Linear)


class PipelineCache:
    """Per-process memo of pipelines: one per (case, profile), shared by its checks."""

    def __init__(self, artifact_dir: Path | None = None, settings: RunSettings | None = None) -> None:
        self._pipelines: dict[tuple[str, str], Pipeline] = {}
        self.artifact_dir = artifact_dir
        self.settings = settings or RunSettings()
        self._warm = False

    def get(self, case: Case, profile: str) -> Pipeline:
        key = (case.name, profile)
        if not self._warm:
            warm_imports()
            self._warm = True
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(case, profile, self.artifact_dir, self.settings)
        return self._pipelines[key]

    def peek(self, case_name: str, profile: str) -> Pipeline | None:
        """The pipeline of (case, profile) if one was built in this process, else None."""
        return self._pipelines.get((case_name, profile))

    def release(self, case_name: str, profile: str) -> None:
        self._pipelines.pop((case_name, profile), None)
