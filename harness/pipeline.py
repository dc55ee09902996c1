"""The artifacts of one (case, profile) in one worker process, as memoised stages:
reference -> wrapped (NO_QUANT) -> quantized (prepare, calibrate, convert) -> outputs -> export
adapters -> torch.export -> Circle -> replay. Each stage runs at most once per worker however
many checks ask for it (the stage engine: harness/primitives/stage_engine.py; the mutation guard that
proves checks leave them alone: harness/primitives/mutation_guard.py; which cached export or conversion
may stand in for a fresh one: harness/export/cache_policy.py). The tico lifecycle helpers the stages
and checks share live in harness/primitives/lifecycle_ops.py.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from harness import compat
from harness.export import stages as export_stages
from harness.export.cache_policy import circle_artifact, export_record
from harness.model.case import Case
from harness.model.case_parts import Built, Sample
from harness.model.check_settings import resolve
from harness.model.sweep import group_label
from harness.primitives.lifecycle_ops import set_seed, unwrap, wrap_noquant  # noqa: F401 - re-exported for checks
from harness.primitives.stage_engine import StageEngine, StageError, StageTimeout, time_limit  # noqa: F401 - re-exported
from harness.tico_facts.wrapper_coverage import measure, record_forwards


@dataclass(frozen=True)
class RunSettings:
    """Session options checks may need (where goldens live, whether to rewrite them)."""

    golden_dir: Path = Path("golden")
    # None: compare; "write": stage rewritten goldens for the end of the run; "fail": the same,
    # and an item whose golden is new or changed beyond noise fails.
    update_golden: str | None = None
    golden_staging_dir: Path | None = None
    stage_timeout: float | None = None
    # content-addressed ExportedProgram -> Circle cache directory (None: always convert)
    circle_cache_dir: Path | None = None
    # torch.export reuse keyed by the adapter's execution (None: always trace)
    export_cache_dir: Path | None = None
    run_id: str = ""
    # where this run keeps the tensors its goldens compare, so it can serve as a base run
    run_golden_dir: Path | None = None
    # --baseline: the base run's results.json (or its report directory)
    base_results: Path | None = None
    # --tico-coverage: the export stage also runs the adapter eagerly, so the code torch.export traces
    # (which coverage does not see) is measured under that stage (harness/tico_facts/item_map.py)
    measure_traced_code: bool = False


class Pipeline(StageEngine):
    """Artifacts of one (case, profile). Construct via ``PipelineCache.get``."""

    def __init__(self, case: Case, profile: str, artifact_dir: Path | None = None, settings: RunSettings | None = None):
        self.case = case
        self.profile = profile
        self.artifact_dir = artifact_dir
        self.settings = settings or RunSettings()
        # the node id's bracket: the profile, then a sweep variant's axes (harness/model/sweep.py)
        self.label = group_label(case, profile)
        super().__init__(case.name, self.label, self.settings.stage_timeout)
        # the group's key (harness/records/node_ids.py); a collected item sets it with its file
        self.group = f"{case.name}[{self.label}]"
        # id() of every module of the quantized tree whose forward ran in a QUANT evaluation
        # (harness.tico_facts.wrapper_coverage: which registered wrappers a case exercises).
        self._quant_ran: set[int] = set()

    def check_settings(self, check: Any) -> Any:
        """``check``'s settings for this case and profile: its defaults, the case's overrides,
        then the profile's (harness/model/check_settings.py)."""

        return resolve(check, self.case, self.profile)

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
            algorithm = self.case.algorithm
            if algorithm is None:
                prepared = self._stage("prepare", lambda: do_prepare(copy.deepcopy(built.module), cfg))
            else:
                # prepare consumes a copy: the algorithm's output stays the float module checks wrap
                module, record = self._algorithm_applied()
                prepared = self._stage("prepare", lambda: do_prepare(copy.deepcopy(module), cfg))
                if algorithm.handoff is not None:
                    self._stage("handoff", lambda: algorithm.handoff(prepared, module, record))

            def calibrate() -> None:
                for sample in built.inputs.calibration:
                    sample.call(prepared)

            self._stage("calibrate", calibrate)
            return self._stage("convert", lambda: do_convert(prepared).eval())

        return self._stage("quantized", compute)

    def _algorithm_applied(self) -> tuple[torch.nn.Module, Any]:
        """The case's algorithm run on a private float copy with the calibration samples (once)."""

        def compute() -> tuple[torch.nn.Module, Any]:
            module = copy.deepcopy(self.built.module)
            call = self.case.reference_call or (lambda m, sample: sample.call(m))
            record = self.case.algorithm.run(module, self.built.inputs.calibration, call)
            return module.eval(), record

        return self._stage("algorithm", compute)

    @property
    def float_module(self) -> torch.nn.Module:
        """The float module the case hands to wrapq: the reference, or the algorithm's output.
        Shared: copy it before wrapping."""
        if self.case.algorithm is None:
            return self.built.module
        return self._algorithm_applied()[0]

    @property
    def algorithm_record(self) -> Any:
        """What the case's algorithm computed (harness.model.algorithm.AlgorithmRecord)."""
        _ = self.quantized
        return self._algorithm_applied()[1]

    @property
    def ptq_alone(self) -> torch.nn.Module:
        """The same PTQ flow without the case's algorithm: what the algorithm is measured against."""
        return self._stage("ptq_alone", lambda: self.ptq_flow(self.ptq_config, with_algorithm=False))

    def ptq_flow(self, cfg: Any, *, with_algorithm: bool = True) -> torch.nn.Module:
        """The case's flow on a fresh float copy with ``cfg``, unmemoised (for checks that vary the
        config): [algorithm ->] prepare -> [handoff ->] calibrate -> convert."""
        from tico.quantization import convert, prepare

        built, algorithm = self.built, self.case.algorithm if with_algorithm else None
        do_prepare = self.case.prepare or (lambda module, c: prepare(module, c, inplace=True))
        do_convert = self.case.convert or (lambda module: convert(module, inplace=True))
        module = copy.deepcopy(built.module)
        record = None
        if algorithm is not None:
            call = self.case.reference_call or (lambda m, sample: sample.call(m))
            record = algorithm.run(module, built.inputs.calibration, call)
        prepared = do_prepare(module, cfg)
        if algorithm is not None and algorithm.handoff is not None:
            algorithm.handoff(prepared, module, record)
        with torch.no_grad():
            for sample in built.inputs.calibration:
                sample.call(prepared)
        return do_convert(prepared).eval()

    def output(self, which: str, sample_name: str) -> torch.Tensor:
        """Output tensor of 'reference', 'noquant', 'quant' or 'ptq_alone' (the case's PTQ flow
        without its algorithm) for an evaluation sample."""
        modules = {
            "reference": lambda: self.built.module,
            "noquant": lambda: self.wrapped,
            "quant": lambda: self.quantized,
            "ptq_alone": lambda: self.ptq_alone,
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

        model = self.quantized  # built outside the recorder: prepare/calibrate forwards do not count
        with record_forwards(self._quant_ran):
            return sample.call(model)

    @property
    def wrapper_coverage(self) -> dict[str, Any]:
        """Registered wrappers instantiated in the quantized tree and those that ran a forward on
        the evaluation samples in QUANT mode (``harness.tico_facts.wrapper_coverage.measure``). Reuses the
        QUANT outputs the checks computed; computes the ones no check needed."""

        def compute() -> dict[str, Any]:

            start = time.perf_counter()
            failed = {}
            for name in self.built.inputs.evaluation:
                try:
                    self.output("quant", name)
                except StageError as err:  # what ran before the failure still counts; the failure is said
                    failed[name] = str(err)
            record = measure(self.quantized, self._quant_ran, reference=self.float_module)
            record["samples"] = sorted(self.built.inputs.evaluation)
            if failed:
                record["failed_samples"] = failed
            record["seconds"] = round(time.perf_counter() - start, 4)
            return record

        return self._stage("wrapper_coverage", compute)

    def case_probe(self, name: str, compute: Callable[[], Any]) -> Any:
        """What a case's own callable (mask probes, rotary tables) computes on the trees, as a named
        stage: a wrapper that crashes there fails that check with the stage's error, judged as any."""
        return self._stage(name, compute)

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
        return _tensor_leaves(self.export_raw_output(mode, sample_name))

    # -- export once: torch.export -> Circle -> replay ------------------------------
    @property
    def export_sample_name(self) -> str:
        """The deployment profile that is exported (the first sample the case names)."""
        assert self.case.export is not None
        return self.case.export.samples[0]

    @property
    def exported_program(self) -> Any:
        """torch.export of the QUANT export adapter, once per case; feeds every export check."""

        name, measured = self.export_sample_name, self.settings.measure_traced_code
        return self._stage(
            "torch_export",
            lambda: export_stages.export_program(
                self.export_adapter("quant", name), self.case.export.args(self.sample(name)), measured
            ),
        )

    @property
    def export_record(self) -> Any:
        """What the export checks read from the torch.export program: its output on the export
        sample, graph facts and Circle cache key; reused from the export cache when the
        adapter's execution key matches (harness/export/cache_policy.py), traced otherwise."""

        return self._stage("export_record", lambda: export_record(self))

    def exported_program_output(self) -> torch.Tensor:
        return self._stage(
            "torch_export_output",
            lambda: self.case.output(self.export_record.output()).detach(),
        )

    def exported_program_output_leaves(self) -> list[torch.Tensor]:
        """Every tensor the torch.export program returns, flattened as the adapter's are."""
        return _tensor_leaves(self.export_record.output())

    @property
    def circle(self) -> Any:
        """tico's Circle conversion of the exported program (kept as a .circle artifact), or the
        cached conversion of the same program by the same code (harness/export/cache_policy.py)."""

        def compute() -> Any:
            artifact = circle_artifact(self)
            if self.artifact_dir is not None:
                self.artifact_dir.mkdir(parents=True, exist_ok=True)
                path = self.artifact_dir / f"{self.case.name}[{self.label}].q.circle"
                path.write_bytes(artifact.binary)
                artifact.path = str(path)
            return artifact

        return self._stage("circle_convert", compute)

    def circle_outputs(self, mode: str) -> list[torch.Tensor]:
        """Every Circle replay output ('fake_quantize' or 'native'), each shaped like the torch
        export output it corresponds to (same flattened order)."""

        sample = self.sample(self.export_sample_name)

        def compute() -> list[torch.Tensor]:
            outputs = export_stages.replay_circle(self.circle, self.case.export.args(sample), mode)
            references = self.export_output_leaves("quant", self.export_sample_name)
            if len(outputs) != len(references):
                raise ValueError(
                    f"the Circle model has {len(outputs)} outputs, the export adapter returns {len(references)} tensors"
                )
            shaped = []
            for index, (out, ref) in enumerate(zip(outputs, references)):
                array = np.asarray(out)
                if array.size != ref.numel():
                    raise ValueError(
                        f"Circle output {index} has shape {tuple(array.shape)}, the export adapter's tensor "
                        f"{tuple(ref.shape)}"
                    )
                shaped.append(torch.from_numpy(array).reshape(ref.shape))
            return shaped

        return self._stage(f"circle_replay[{mode}]", compute)


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
        key = (case.name, group_label(case, profile))
        if not self._warm:
            warm_imports()
            self._warm = True
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(case, profile, self.artifact_dir, self.settings)
        return self._pipelines[key]

    def peek(self, case_name: str, profile: str) -> Pipeline | None:
        """The pipeline of (case, profile) if one was built in this process, else None; a sweep
        variant's ``profile`` is its label ("tiny,kv_heads=2")."""
        return self._pipelines.get((case_name, profile))

    def release(self, case_name: str, profile: str) -> None:
        self._pipelines.pop((case_name, profile), None)


def _tensor_leaves(output: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) output in torch's pytree order, detached."""
    leaves, _ = compat.tree_flatten(output)
    return [leaf.detach() for leaf in leaves if isinstance(leaf, torch.Tensor)]
