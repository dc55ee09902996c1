"""Isolated vs propagated quantization error of every wrapped submodule.

The leave-one-out table (harness/diagnosis/site_attribution.py) says which fake-quant site costs the output
most. This says where in the module tree error is *made* and where it is only *carried*, the
way ONNX Runtime's qdq_loss_debug and Numeric Suite report local vs accumulated error. On a
private copy of the QUANT tree and one sample:

* **float run**: every fake-quant site switched off (``set_fake_quant_enabled(False)``), so
  the same wrapper code computes in float; every wrapper's inputs and output are kept;
* **quantized run**: as is; every wrapper's output is kept;
* **isolated**: each wrapper called alone, as is, on the float run's inputs to it.

``propagated_sqnr_db`` compares a wrapper's quantized-run output with its float-run output: its
own error plus everything upstream. ``isolated_sqnr_db`` compares its isolated output with the
float-run output: its own error only. A wrapper called several times (a shared module) sums
signal and noise over its calls. Wrappers are tico's ``QuantModuleBase`` modules, in the order
they were first entered; a ``PTQWrapper``'s own entry is folded into the module it wraps (the
two compute the same tensor).

Limits: a wrapper's call alone is a replay with its recorded arguments; a forward that reads
state its caller sets during the run (not passed as an argument) sees the state the run left,
and a row whose call alone is much worse than in the model says so. Compared on the output
leaves that are floating tensors; positions outside the sample's
``valid_tokens`` are dropped where a tensor is shaped like them (padding carries no meaning).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from harness import compat
from harness.diagnosis.float_policy import identity_observers, refuses_disabled_fake_quant
from harness.primitives.metrics import as_float

# Errors of a wrapper and of what is upstream of it can partly cancel, but a wrapper whose call
# alone is this much worse than the same wrapper in the model is flagged: the replay may lack
# context its caller provides outside its arguments.
SUSPECT_REPLAY_DB = 3.0


@dataclass
class SubmoduleError:
    path: str
    wrapper: str
    calls: int
    isolated_sqnr_db: float | None  # None: its isolated call could not be made (the reason is in `note`)
    propagated_sqnr_db: float | None
    inherited_db: float | None  # isolated minus propagated: how much of its error came from upstream
    outermost: bool = False  # the first wrapper entered: the whole case (its inputs are the sample's)
    note: str = ""


class _Noise:
    def __init__(self) -> None:
        self.signal = self.noise = 0.0
        self.compared = 0

    def add(self, reference: list[torch.Tensor], candidate: list[torch.Tensor]) -> None:
        for ref, cand in zip(reference, candidate):
            if ref.shape != cand.shape:
                continue
            r, c = as_float(ref), as_float(cand)
            self.signal += float((r**2).sum())
            self.noise += float(((r - c) ** 2).sum())
            self.compared += r.numel()

    def sqnr_db(self) -> float | None:
        if not self.compared:
            return None
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)


def _float_leaves(output: Any, valid: torch.Tensor | None) -> list[torch.Tensor]:
    leaves = [
        leaf.detach()
        for leaf in compat.tree_leaves(output)
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel()
    ]
    return _valid(leaves, valid)


def _valid(leaves: list[torch.Tensor], valid: torch.Tensor | None) -> list[torch.Tensor]:
    if valid is None:
        return leaves
    keep = valid.to(torch.bool)
    return [leaf[keep] if tuple(leaf.shape[: keep.dim()]) == tuple(keep.shape) else leaf for leaf in leaves]


def _wrappers(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from tico.quantization.wrapq.wrappers.ptq_wrapper import PTQWrapper
    from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase

    return [
        (path, module)
        for path, module in root.named_modules()
        if isinstance(module, QuantModuleBase) and not isinstance(module, PTQWrapper)
    ]


def _record(wrappers, keep_inputs: bool):
    """Forward hooks that keep each wrapper's outputs per call (and a private copy of its inputs)."""
    calls: dict[str, list[dict[str, Any]]] = {path: [] for path, _ in wrappers}
    order: list[str] = []
    handles = []
    for path, module in wrappers:

        def pre(mod, args, kwargs, path=path):
            if path not in order:
                order.append(path)
            entry = {"inputs": copy.deepcopy((args, kwargs)) if keep_inputs else None}
            calls[path].append(entry)

        def post(mod, args, kwargs, output, path=path):
            # copied now: a caller may write into the tensor later (a model scatters image
            # features into the token embeddings in place)
            calls[path][-1]["output"] = [leaf.clone() for leaf in _float_leaves(output, None)]

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    return calls, order, handles


class FloatRunRefused(Exception):
    """tico runs the tree in float neither with its fake-quants disabled nor with IdentityObservers."""


def submodule_errors(quantized: torch.nn.Module, sample: Any) -> list[SubmoduleError]:
    """The table for ``quantized`` (never touched: a private copy runs) on ``sample``."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    twin = copy.deepcopy(quantized)
    wrappers = _wrappers(twin)
    observers = [m for m in twin.modules() if isinstance(m, ObserverBase)]
    enabled = {id(obs): bool(obs.fake_quant_enabled) for obs in observers}
    valid = sample.valid_tokens

    def run(keep_inputs: bool):
        calls, order, handles = _record(wrappers, keep_inputs)
        try:
            with torch.no_grad():
                sample.call(twin)
        finally:
            for handle in handles:
                handle.remove()
        return calls, order

    for obs in observers:
        obs.set_fake_quant_enabled(False)
    try:
        floats, order = run(keep_inputs=True)
    except ValueError as exc:  # every observer an IdentityObserver: the all-float path tico accepts
        if not refuses_disabled_fake_quant(exc):
            raise
        paths = [path for path, m in twin.named_modules() if isinstance(m, ObserverBase)]
        try:
            with identity_observers(twin, paths):
                floats, order = run(keep_inputs=True)
        except ValueError as refused:  # an observer outside the tree (a bound cache producer) stays affine
            raise FloatRunRefused(str(refused).strip().splitlines()[0]) from None
    finally:
        for obs in observers:
            obs.set_fake_quant_enabled(enabled[id(obs)])
    quants, _ = run(keep_inputs=False)

    table = []
    for index, path in enumerate(order):
        module = twin.get_submodule(path) if path else twin
        propagated, isolated, note = _Noise(), _Noise(), ""
        float_calls, quant_calls = floats[path], quants[path]
        if len(float_calls) != len(quant_calls):
            note = f"called {len(float_calls)} times in float, {len(quant_calls)} quantized"
        for f_call, q_call in zip(float_calls, quant_calls):
            reference = _valid(f_call.get("output", []), valid)
            propagated.add(reference, _valid(q_call.get("output", []), valid))
            args, kwargs = copy.deepcopy(f_call["inputs"])
            try:
                with torch.no_grad():
                    alone = module(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - one wrapper's refusal costs only its row
                note = f"isolated call failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                isolated = None
                break
            isolated.add(reference, _valid(_float_leaves(alone, None), valid))
        iso = isolated.sqnr_db() if isolated is not None else None
        prop = propagated.sqnr_db()
        inherited = (
            iso - prop if iso is not None and prop is not None and math.isfinite(iso) and math.isfinite(prop) else None
        )
        if inherited is not None and inherited < -SUSPECT_REPLAY_DB and not note:
            note = (
                f"alone it is {-inherited:.3g} dB worse than in the model: its forward may read state its caller "
                f"sets during the run, which a call alone does not see"
            )
        table.append(
            SubmoduleError(
                path=path or "<root>",
                wrapper=type(module).__name__,
                calls=len(quant_calls),
                isolated_sqnr_db=iso,
                propagated_sqnr_db=prop,
                inherited_db=inherited,
                outermost=index == 0,
                note=note,
            )
        )
    return table


@dataclass(frozen=True)
class Origin:
    """Where a case's error is made most: a wrapped submodule (its own, isolated error), or the case's
    outermost wrapper's own fake-quant sites (``own_sites``: the whole case's isolated error beyond
    what its top-level children make alone)."""

    path: str
    wrapper: str
    isolated_sqnr_db: float
    propagated_sqnr_db: float | None
    own_sites: bool = False


def _noise_ratio(sqnr_db: float) -> float:
    return 10 ** (-sqnr_db / 10)


def error_origin(table: list[SubmoduleError]) -> Origin | None:
    """The wrapper whose own error is largest (rows with a note -- a failed or suspect replay -- are
    not trusted for it), weighed against the outermost wrapper's own sites: the case's isolated noise
    (relative to its output) beyond the sum its top-level children make alone, each relative to its
    own output. Whichever makes more is where error is made."""
    rows = [row for row in table if not row.outermost and row.isolated_sqnr_db is not None and not row.note]
    worst = min(rows, key=lambda row: row.isolated_sqnr_db, default=None)
    outer = next((row for row in table if row.outermost and row.isolated_sqnr_db is not None), None)
    if outer is not None and not outer.note:
        top = [row for row in rows if not any(row.path.startswith(other.path + ".") for other in rows)]
        own = _noise_ratio(outer.isolated_sqnr_db) - sum(_noise_ratio(row.isolated_sqnr_db) for row in top)
        if own > 0 and (worst is None or own > _noise_ratio(worst.isolated_sqnr_db)):
            return Origin(outer.path, outer.wrapper, -10 * math.log10(own), outer.propagated_sqnr_db, own_sites=True)
    if worst is None:
        return None
    return Origin(worst.path, worst.wrapper, worst.isolated_sqnr_db, worst.propagated_sqnr_db)
