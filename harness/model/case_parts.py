"""The parts of a case: what its builder returns (``Sample``, ``CaseInputs``, ``Built``) and what
it can offer beyond its module and inputs, each switching on the checks that need it (an export
adapter, rotary tables, attention-mask probes, a language-model head, a rotation handoff). A check
whose capability a case lacks is not applicable there, never silently passed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch


@dataclass(frozen=True)
class Sample:
    """One forward call of the module under test.

    ``valid_tokens`` marks which output positions carry meaning (False on padding), shaped
    like the output's leading (batch, sequence) dims. Comparisons are restricted to it.
    """

    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    valid_tokens: torch.Tensor | None = None

    def call(self, module: torch.nn.Module) -> Any:
        return module(*self.args, **dict(self.kwargs))


@dataclass(frozen=True)
class CaseInputs:
    """Calibration samples and named evaluation samples ("default" is required)."""

    calibration: tuple[Sample, ...]
    evaluation: Mapping[str, Sample]

    def __post_init__(self) -> None:
        if "default" not in self.evaluation:
            raise ValueError("evaluation inputs must include a 'default' sample")
        if not self.calibration:
            raise ValueError("at least one calibration sample is required")


@dataclass
class Built:
    """What a case builder returns: the seeded reference module, its inputs, and free-form
    facts the case's capabilities need later (configs, grids, position ids)."""

    module: torch.nn.Module
    inputs: CaseInputs
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportCapability:
    """How to obtain the static export adapter for one evaluation sample.

    ``adapter(root, sample, built)`` receives a private copy of the wrapped model (the
    pipeline copies it, since adapters may register buffers on the wrapper) and returns the
    module that ``torch.export`` would trace; ``args(sample)`` gives its positional inputs.
    """

    adapter: Callable[[torch.nn.Module, Sample, Built], torch.nn.Module]
    args: Callable[[Sample], tuple]
    samples: tuple[str, ...] = ("default",)
    # False when the module itself is exported (no adapter factory that could refuse CALIB).
    refuses_calib: bool = True
    # Export contract probes (optional; a missing one is reported as not checked):
    # ask the wrapper for an export mode it does not support -- must raise;
    unsupported_mode: Callable[[torch.nn.Module, Sample, Built], Any] | None = None
    # positional inputs that contradict the adapter's fixed profile -- running them must raise.
    contradicting_args: Callable[[Sample, Built], tuple] | None = None
    # Why the wrapper builds its adapter in QUANT mode only (None: NO_QUANT must work too); the
    # NO_QUANT half of dynamic_vs_export is then not compared, and the reason is noted.
    quant_only: str | None = None


class PreparedExport(torch.nn.Module):
    """An export adapter that tico's API calls only inside a preparation it gives (tico main's
    ``prepared_static_export(model, max_seq_len)`` installs a whole model's static inputs for the
    duration): every eager call enters ``prepare(inner)``, and torch.export traces ``inner`` inside it
    (harness/export/stages.export_program), so the exported program is the inner adapter's."""

    def __init__(self, inner: torch.nn.Module, prepare: Callable[[torch.nn.Module], Any]):
        super().__init__()
        self.inner = inner
        self.prepare = prepare

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.prepare(self.inner):
            return self.inner(*args, **kwargs)

    def get_submodule(self, target: str) -> torch.nn.Module:
        """A path as the exported program names it: the inner adapter's (its observers, its wrappers)."""
        return self.inner.get_submodule(target) if target else self


def whole_module_export(
    args: Callable[[Sample], tuple] = lambda sample: sample.args, **kwargs: Any
) -> ExportCapability:
    """Export the wrapped module itself (no static adapter): there is no adapter factory that
    could refuse CALIB mode, so that probe is off."""
    return ExportCapability(adapter=lambda root, sample, built: root, args=args, refuses_calib=False, **kwargs)


@dataclass(frozen=True)
class RotaryTables:
    """A wrapper's cos/sin next to Hugging Face's for the same positions."""

    label: str
    wrapper: tuple[torch.Tensor, torch.Tensor]
    reference: tuple[torch.Tensor, torch.Tensor]
    valid_tokens: torch.Tensor | None = None


@dataclass(frozen=True)
class RotaryCapability:
    """``tables(wrapped_noquant, reference_module, built)`` -> list of RotaryTables."""

    tables: Callable[[torch.nn.Module, torch.nn.Module, Built], list[RotaryTables]]


@dataclass(frozen=True)
class MaskProbe:
    """An additive attention mask the wrapper produced, with the truth to judge it by.

    By default a (query, key) pair is allowed when both tokens are valid (bidirectional
    attention with padding). ``allowed`` (B, S_q, S_k) bool overrides that, e.g. for causal
    masks; ``valid_tokens`` then marks the query rows that must see at least one key."""

    label: str
    mask: torch.Tensor
    valid_tokens: torch.Tensor
    fill_value: float
    allowed: torch.Tensor | None = None

    def allowed_pairs(self) -> torch.Tensor:
        if self.allowed is not None:
            return self.allowed.to(torch.bool)
        valid = self.valid_tokens.to(torch.bool)
        return valid[:, :, None] & valid[:, None, :]


@dataclass(frozen=True)
class MaskCapability:
    """``probes(wrapped_noquant, built)`` -> list of MaskProbe."""

    probes: Callable[[torch.nn.Module, Built], list[MaskProbe]]


@dataclass(frozen=True)
class LanguageModelCapability:
    """The case's output is next-token logits over a vocabulary: ``token_ids(sample)`` gives the
    (B, S) token ids the logits at each position predict the successor of (the sample's
    ``valid_tokens`` marks real tokens; padding is neither predicted nor a target)."""

    token_ids: Callable[[Sample], torch.Tensor]


@dataclass(frozen=True)
class RotationHandoffCapability:
    """The case's float module is what a rotation algorithm (SpinQuant) made of
    ``original(built)``, the float module before it; wrapq PTQ follows (the rotation_handoff
    check). ``to_original(output, built)`` maps the case module's output into the original's
    basis (None: the outputs must agree as they are); ``claimed_sites(path)`` selects the
    fake-quant sites where the algorithm claims a lower quantization error (None: no claim)."""

    algorithm: str
    original: Callable[[Built], torch.nn.Module]
    to_original: Callable[[torch.Tensor, Built], torch.Tensor] | None = None
    claimed_sites: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class CallProbe:
    """One call of the wrapper outside the case's samples, the way a user may make it: an option
    the wrapper documents (explicit ``position_ids``, ``return_dict=False``, another mask form) or
    an input its contract rejects.

    ``call(wrapper)`` makes the call on a private copy of the wrapper tree (``mode``: "noquant" or
    "quant"). Exactly one of:
    ``refusal``: a regex over ``"ExceptionType: first line of the message"``; the input breaks the
    wrapper's contract and must be refused with that error, not accepted and not failed elsewhere;
    ``reference(hf_module)``: the same request made of the Hugging Face module (a private copy); a
    probe of a tico helper with no HF counterpart computes what HF does in its place (Gemma4Model's
    ``masked_scatter`` for tico's fusion helpers). The tensors ``pick`` takes from both answers must
    agree, on ``valid_tokens`` (B, S) of each when given (padded positions carry no meaning, as in
    ``Sample``);
    ``twin(wrapper)``: the same request answered by another of tico's own paths on the same tree (a
    host artifact that replays an export adapter, a stage adapter beside the wrapper's forward); what
    ``pick`` takes from both must agree (a quantized path has no HF counterpart to meet)."""

    label: str
    call: Callable[[torch.nn.Module], Any]
    refusal: str | None = None
    reference: Callable[[torch.nn.Module], Any] | None = None
    pick: Callable[[Any], list[torch.Tensor]] | None = None
    twin: Callable[[torch.nn.Module], Any] | None = None
    mode: str = "noquant"
    valid_tokens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if sum(part is not None for part in (self.refusal, self.reference, self.twin)) != 1:
            raise ValueError(f"call probe {self.label!r}: give exactly one of refusal, reference and twin")
        if self.mode not in ("noquant", "quant"):
            raise ValueError(f"call probe {self.label!r}: mode must be 'noquant' or 'quant', got {self.mode!r}")


@dataclass(frozen=True)
class CallContractCapability:
    """``probes(built)`` -> list of CallProbe: the call_contract check makes each call."""

    probes: Callable[[Built], list[CallProbe]]
