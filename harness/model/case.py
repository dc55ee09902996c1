"""Declarative case model: one Case pairs a seeded Hugging Face reference with its TICO wrapper.

A case says *what* to build and feed; the pipeline decides *when* to run it and the checks
decide *what to compare*. Optional capabilities (export adapter, rotary tables, attention
mask) switch on the checks that need them; a check whose capability is missing is reported
as not applicable, never silently passed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from packaging.version import InvalidVersion, Version

from harness.model.algorithm import AlgorithmCapability
from harness.model.case_parts import (
    Built,
    CallContractCapability,
    ExportCapability,
    LanguageModelCapability,
    MaskCapability,
    RotaryCapability,
    RotationHandoffCapability,
    Sample,
)
from harness.model.expectations import Expected
from harness.model.sweep import Sweep, Variant


class CaseDefinitionError(ValueError):
    """A case definition is malformed; the message names the case and the field."""

    def __init__(self, case_name: str, field_name: str, problem: str):
        self.case_name = case_name
        self.field_name = field_name
        super().__init__(f"case {case_name!r}: field {field_name!r}: {problem}")


def default_ptq_config(profile: str) -> Any:
    """TICO's default PTQConfig; imported lazily so collection never needs tico."""
    from tico.quantization.config.ptq import PTQConfig

    return PTQConfig()


def first_tensor(output: Any) -> torch.Tensor:
    """Pick the tensor that represents a module's output (HF output objects included)."""
    if isinstance(output, torch.Tensor):
        return output
    for attr in ("last_hidden_state", "logits", "pooler_output"):
        value = getattr(output, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            try:
                return first_tensor(item)
            except TypeError:
                continue
    raise TypeError(f"no tensor found in output of type {type(output).__name__}")


_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class ProfileLimits:
    """What a case gates on one profile besides its own settings. ``settings`` (check name ->
    fields) replaces those fields of the case's ``settings`` on that profile and ``source`` says
    where the numbers come from: both are measured data, read from the case directory's
    ``limits/<profile>.json`` (``harness/model/limits_data.py``), so a case file rarely states them. A
    profile without an entry is gated by the case's settings (stated for its first profile), and its
    results say so. What a case file does state here is what differs on the profile by diagnosis:
    ``unused_observers`` replaces the case's allowlist (an observer can be fed at one width and not at
    another); ``expected_failures`` (check -> Expected, or None where the cause is absent on that
    profile) is merged over the case's own (a finding can need a shape the other profiles lack, e.g.
    more than one KV head)."""

    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = ""
    unused_observers: Mapping[str, str] | None = None
    expected_failures: Mapping[str, Expected | None] | None = None


@dataclass(frozen=True)
class Case:
    """A wrapper under test. See the module docstring for the contract."""

    name: str
    family: str
    build: Callable[[str], Built]
    description: str = ""
    profiles: tuple[str, ...] = ("tiny",)
    # profiles whose outputs are pinned by committed goldens; the others (real-width nightly
    # profiles) are gated by thresholds only, and their golden item says so.
    golden_profiles: tuple[str, ...] = ("tiny",)
    # profiles whose Circle structure is pinned by a committed baseline (circle_structure); None: the
    # golden profiles. A sweep variant keeps its declared case's: a variant changes what is built.
    structure_profiles: tuple[str, ...] | None = None
    seed: int = 0
    # check name -> {settings field: value}: overrides of the check's defaults (its limits,
    # tolerances); the check declares the fields (harness/checks/<check>.py, ``Settings``).
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # profile -> its own limits with their source (python -m harness limits proposes them).
    profile_limits: Mapping[str, ProfileLimits] = field(default_factory=dict)
    ptq_config: Callable[[str], Any] = default_ptq_config
    # a PTQ algorithm (GPTQ, SmoothQuant, ...) run on the float module before wrapq, with its
    # handoff (harness/model/algorithm.py); switches on algorithm_handoff and algorithm_gain
    algorithm: AlgorithmCapability | None = None
    output: Callable[[Any], torch.Tensor] = first_tensor
    # How to call the Hugging Face module when its signature differs from the wrapper's
    # (e.g. a 4-D mask where the wrapper takes 3-D). None: the same call as the wrapper.
    reference_call: Callable[[torch.nn.Module, Sample], Any] | None = None
    requires: tuple[str, ...] = ()
    min_versions: Mapping[str, str] = field(default_factory=dict)
    export: ExportCapability | None = None
    rotary: RotaryCapability | None = None
    mask: MaskCapability | None = None
    # calls beyond the samples: documented options matched against HF, contract-breaking inputs refused
    calls: CallContractCapability | None = None
    # the output is language-model logits (switches on the model-level language-model metrics)
    language_model: LanguageModelCapability | None = None
    # the float module is a rotation algorithm's output (SpinQuant): the rotation_handoff check
    rotation_handoff: RotationHandoffCapability | None = None
    # () -> why the case cannot run here (an optional dependency beyond ``requires``, with the
    # command that installs it), or None; looked up once per session.
    unavailable: Callable[[], str | None] | None = None
    # check name -> why it cannot apply to this wrapper (shown as the skip reason).
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    # evaluation sample -> why its quantized accuracy is measured but not gated.
    ungated_samples: Mapping[str, str] = field(default_factory=dict)
    # check name -> the diagnosed failure on the pinned stack: Expected(reason, problems=(regex, ...)).
    # The item is xfail only while every problem matches and every pattern is matched (harness/model/expectations.py).
    expected_failures: Mapping[str, Expected] = field(default_factory=dict)
    # exported-graph op target (e.g. 'aten.permute.default', 'getitem') -> why it needs no qparam.
    qparam_allowlist: Mapping[str, str] = field(default_factory=dict)
    # observer path pattern (fnmatch, relative to the wrapped root) -> why it is never fed.
    unused_observers: Mapping[str, str] = field(default_factory=dict)
    # the shapes the case runs at TICO's deployment profile (static_runtime), by the name of TICO's
    # wrapper-smoke accessor giving the same number (tests/test_static_runtime_profile.py compares them)
    deployment_shapes: Mapping[str, Any] = field(default_factory=dict)
    # How to wrap, when the root is not wrapped whole (e.g. a composite whose children are
    # prepared one by one to keep tied weights): wrap(module, cfg) -> NO_QUANT tree,
    # prepare(module, cfg) -> CALIB tree, convert(module) -> QUANT tree. None: tico's defaults.
    wrap: Callable[[torch.nn.Module, Any], torch.nn.Module] | None = None
    prepare: Callable[[torch.nn.Module, Any], torch.nn.Module] | None = None
    convert: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    # the tico wrapper class name the root module must resolve to (None: not asserted).
    expected_wrapper: str | None = None
    # how many observers the wrapper tree must hold (None: reported, not asserted).
    expected_observer_count: int | None = None
    # configuration axes and the variants the PR gate and the nightly run (harness/model/sweep.py);
    # validated when the case file is collected (a malformed sweep is a <definition:...> item).
    sweep: Sweep | None = None
    # set by the harness on a variant's copy of the case; None on the case as declared.
    variant: Variant | None = None

    def __post_init__(self) -> None:
        name = self.name if isinstance(self.name, str) else repr(self.name)
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise CaseDefinitionError(name, "name", "must match [a-z][a-z0-9_]*")
        if not isinstance(self.family, str) or not self.family:
            raise CaseDefinitionError(name, "family", "must be a non-empty string")
        if not callable(self.build):
            raise CaseDefinitionError(name, "build", f"must be callable, got {type(self.build).__name__}")
        if (
            not isinstance(self.profiles, tuple)
            or not self.profiles
            or not all(isinstance(p, str) and _NAME_RE.match(p) for p in self.profiles)
        ):
            raise CaseDefinitionError(name, "profiles", "must be a non-empty tuple of profile names")
        if not isinstance(self.golden_profiles, tuple) or not set(self.golden_profiles) <= set(self.profiles):
            raise CaseDefinitionError(
                name, "golden_profiles", f"must be a tuple of profiles the case lists {self.profiles}"
            )
        structure = self.structure_profiles
        if structure is not None and (not isinstance(structure, tuple) or not set(structure) <= set(self.profiles)):
            raise CaseDefinitionError(
                name, "structure_profiles", f"must be None or a tuple of profiles the case lists {self.profiles}"
            )
        if not isinstance(self.seed, int):
            raise CaseDefinitionError(name, "seed", f"must be int, got {type(self.seed).__name__}")
        if not isinstance(self.settings, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in self.settings.items()
        ):
            raise CaseDefinitionError(
                name,
                "settings",
                "must map check names to {field: value} mappings "
                "(the fields are checked against each check's settings when collected)",
            )
        for attr in ("wrap", "prepare", "convert", "reference_call", "unavailable"):
            if getattr(self, attr) is not None and not callable(getattr(self, attr)):
                raise CaseDefinitionError(name, attr, "must be callable or None")
        for attr in ("ptq_config", "output"):
            if not callable(getattr(self, attr)):
                raise CaseDefinitionError(name, attr, "must be callable")
        if self.algorithm is not None and not isinstance(self.algorithm, AlgorithmCapability):
            raise CaseDefinitionError(
                name, "algorithm", f"must be AlgorithmCapability or None, got {type(self.algorithm).__name__}"
            )
        for attr, kind in (
            ("export", ExportCapability),
            ("rotary", RotaryCapability),
            ("mask", MaskCapability),
            ("calls", CallContractCapability),
            ("language_model", LanguageModelCapability),
        ):
            value = getattr(self, attr)
            if value is not None and not isinstance(value, kind):
                raise CaseDefinitionError(name, attr, f"must be {kind.__name__} or None, got {type(value).__name__}")
        if self.rotation_handoff is not None and not isinstance(self.rotation_handoff, RotationHandoffCapability):
            raise CaseDefinitionError(
                name,
                "rotation_handoff",
                f"must be RotationHandoffCapability or None, got {type(self.rotation_handoff).__name__}",
            )
        if not isinstance(self.expected_failures, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Expected) for k, v in self.expected_failures.items()
        ):
            raise CaseDefinitionError(
                name,
                "expected_failures",
                "must map check names to Expected(reason, problems=(regex, "
                "...)): an expectation names the problems it covers, not a whole check",
            )
        for attr in ("not_applicable", "qparam_allowlist", "unused_observers"):
            value = getattr(self, attr)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in value.items()
            ):
                raise CaseDefinitionError(name, attr, "must map names to non-empty reasons")
        if not isinstance(self.ungated_samples, Mapping) or "default" in self.ungated_samples:
            raise CaseDefinitionError(
                name, "ungated_samples", "must be a mapping and cannot exempt the 'default' sample"
            )
        if not isinstance(self.profile_limits, Mapping) or not all(
            isinstance(k, str) and isinstance(v, ProfileLimits) for k, v in self.profile_limits.items()
        ):
            raise CaseDefinitionError(name, "profile_limits", "must map profile names to ProfileLimits")
        for profile, limits in self.profile_limits.items():
            if profile not in self.profiles:
                raise CaseDefinitionError(
                    name, f"profile_limits[{profile!r}]", f"names a profile the case does not run ({self.profiles})"
                )
            if not isinstance(limits.settings, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Mapping) for k, v in limits.settings.items()
            ):
                raise CaseDefinitionError(
                    name, f"profile_limits[{profile!r}].settings", "must map check names to {field: value} mappings"
                )
            if limits.expected_failures is not None and not all(
                isinstance(k, str) and (v is None or isinstance(v, Expected))
                for k, v in limits.expected_failures.items()
            ):
                raise CaseDefinitionError(
                    name,
                    f"profile_limits[{profile!r}].expected_failures",
                    "must map check names to Expected(reason, problems=(regex, ...)) or None",
                )
            if not isinstance(limits.source, str) or (limits.settings and not limits.source.strip()):
                raise CaseDefinitionError(
                    name, f"profile_limits[{profile!r}].source", "must say where the limits come from"
                )
        if not isinstance(self.deployment_shapes, Mapping) or not all(
            isinstance(k, str) for k in self.deployment_shapes
        ):
            raise CaseDefinitionError(name, "deployment_shapes", "must map shape names to values")
        if self.export is not None and not self.export.samples:
            raise CaseDefinitionError(name, "export.samples", "must name at least one evaluation sample")

    def limits_source(self, profile: str) -> str:
        """Where the limits gating ``profile`` come from, as results and reports show it."""
        limits = self.profile_limits.get(profile)
        if limits is not None and limits.source.strip():
            return limits.source
        if profile == self.profiles[0]:
            return "the case's settings (measured on this profile; see the case file)"
        return f"no limits stated for profile {profile!r}: the case's settings for {self.profiles[0]!r} apply unchanged"

    def expected_failures_for(self, profile: str) -> Mapping[str, Expected]:
        limits = self.profile_limits.get(profile)
        if limits is None or limits.expected_failures is None:
            return self.expected_failures
        merged = {**self.expected_failures, **limits.expected_failures}
        return {check: expected for check, expected in merged.items() if expected is not None}

    def unused_observers_for(self, profile: str) -> Mapping[str, str]:
        limits = self.profile_limits.get(profile)
        if limits is not None and limits.unused_observers is not None:
            return limits.unused_observers
        return self.unused_observers

    def unavailable_reason(self) -> str | None:
        """Why this case cannot run in this environment, or None when it can."""
        reason = _unavailable_reason(tuple(self.min_versions.items()), tuple(self.requires))
        if reason is None and self.unavailable is not None:
            reason = _probe(self.unavailable)
        return reason


@functools.lru_cache(maxsize=None)
def _probe(unavailable: Callable[[], str | None]) -> str | None:
    return unavailable()


@functools.lru_cache(maxsize=None)
def _unavailable_reason(min_versions: tuple[tuple[str, str], ...], requires: tuple[str, ...]) -> str | None:
    """Installed versions and importable modules do not change within a session: looked up
    once per distinct requirement set, not for every item (it was 6 ms an item)."""
    for package, minimum in min_versions:
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"requires {package}>={minimum}, which is not installed"
        try:
            too_old = Version(installed) < Version(minimum)
        except InvalidVersion:
            return f"cannot compare {package} version {installed!r} with {minimum!r}"
        if too_old:
            return f"requires {package}>={minimum}, found {installed}"
    for module_path in requires:
        try:
            found = importlib.util.find_spec(module_path) is not None
        except (ImportError, ValueError) as exc:
            return f"requires module {module_path}: {type(exc).__name__}: {exc}"
        if not found:
            return f"requires module {module_path}, which is not importable"
    return None
