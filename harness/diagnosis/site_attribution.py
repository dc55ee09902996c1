"""Where a case's quantization error comes from: leave-one-out attribution per fake-quant site.

For every observer of the QUANT wrapper tree (all modules walked, not only the sites tico's
``control.iter_quantization_sites`` yields from each wrapper's own list -- the two are compared
and a difference is recorded), on a private copy of the tree and the default evaluation
sample:

* the output SQNR and PEIR vs the Hugging Face reference (valid tokens) with only that site's
  fake-quant switched off (``ObserverBase.set_fake_quant_enabled``, tico 0.3.0
  ``quantization/wrapq/observers/base.py``), minus the same metrics as is: the **gain**;
* what the site holds and sees: dtype, scale, zero point, the range it was calibrated on, the
  range of its input on the sample, the fraction of input values its qmin..qmax clamps, and its
  local SQNR (input vs its own fake-quant output);
* a **resolution** figure: the values a site must resolve are its input on the sample, or, when
  that input falls into two clusters separated by more than half its range (logits plus an
  additive mask fill), the larger cluster; ``resolved_levels`` is that cluster's range over the
  site's step. Under 1 the step exceeds the range of the values it must resolve.

Beside the sites, every wrapped submodule's isolated and propagated error
(harness/diagnosis/submodule_error.py): where error is made, and where it is only carried.

Cost: one instrumented forward, one forward as is, one forward per evaluated site, and for the
submodule table two forwards plus one isolated call per wrapper call. At most
``max_sites`` sites are evaluated, the ones with the lowest local SQNR first; the rest keep
their site facts and are reported as not evaluated.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness import compat
from harness.diagnosis.float_policy import identity_observers, refuses_disabled_fake_quant
from harness.diagnosis.submodule_error import FloatRunRefused, SubmoduleError, submodule_errors
from harness.primitives.metrics import as_float, peir, select_valid, sqnr_db

# A gap between sorted input values wider than this fraction of the input's range splits it in two.
CLUSTER_GAP_FRACTION = 0.5
# Values kept per site for the cluster analysis (evenly spaced over the sorted input).
_MAX_VALUES = 1 << 16


@dataclass
class Site:
    path: str
    observer: str
    dtype: str
    qscheme: str
    per_channel: bool
    scale: float | None  # per-tensor scale; per-channel: the largest channel's
    zero_point: int | None  # per-tensor only
    observed_min: float | None  # calibration range (min_val / max_val)
    observed_max: float | None
    enabled: bool  # fake-quant on as is
    calls: int = 0  # fake_quant calls on the sample
    input_min: float | None = None
    input_max: float | None = None
    clipped_fraction: float | None = None
    local_sqnr_db: float | None = None
    resolved_min: float | None = None  # the values the site must resolve (see module docstring)
    resolved_max: float | None = None
    resolved_levels: float | None = None
    split: bool = False  # the input fell into two clusters
    # "output": its fake-quant returns the case output; "input": it quantizes a tensor of the
    # sample as given. A boundary site's loss is that tensor's own dtype resolution, which no
    # change inside the wrapper avoids; the check reports it and gates the interior sites.
    boundary: str | None = None
    evaluated: bool = False
    changed: bool | None = None  # switching it off changed the output at all
    sqnr_db_off: float | None = None
    peir_off: float | None = None
    gain_db: float | None = None
    peir_gain: float | None = None  # PEIR as is minus PEIR with the site off
    # why the site cannot be switched off alone (tico refuses every way to run without it): not evaluated
    not_switchable: str | None = None


@dataclass
class Attribution:
    sample: str
    sqnr_db: float
    peir: float
    sites: list[Site]  # ranked: evaluated sites by gain, then the others by local SQNR
    evaluated: int
    capped: bool
    max_sites: int
    forwards: int
    seconds: float
    seconds_per_forward: float
    not_in_tico_sites: list[str] = field(default_factory=list)
    not_walked: list[str] = field(default_factory=list)
    # isolated vs propagated error of every wrapped submodule (harness/diagnosis/submodule_error.py)
    submodules: list[SubmoduleError] = field(default_factory=list)
    # why the table could not be made: tico runs the tree in float in no way the harness has
    submodules_refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _qparams(obs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    scale, zp = getattr(obs, "_cached_scale", None), getattr(obs, "_cached_zp", None)
    if not isinstance(scale, torch.Tensor) or scale.numel() == 0:
        return None, None
    return scale.detach().float(), (zp.detach() if isinstance(zp, torch.Tensor) and zp.numel() else None)


def _broadcast(t: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    if axis is None or t.numel() == 1:
        return t.reshape(()) if t.numel() == 1 else t
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return t.reshape(shape)


def _site_facts(path: str, obs) -> Site:
    scale, zp = _qparams(obs)
    per_channel = getattr(obs, "channel_axis", None) is not None
    lo, hi = getattr(obs, "min_val", None), getattr(obs, "max_val", None)
    return Site(
        path=path,
        observer=type(obs).__name__,
        dtype=str(getattr(obs, "dtype", "")),
        qscheme=str(getattr(obs, "qscheme", "")),
        per_channel=per_channel,
        scale=None if scale is None else float(scale.max()),
        zero_point=None if zp is None or per_channel or zp.numel() != 1 else int(zp),
        observed_min=_finite(float(lo.min())) if isinstance(lo, torch.Tensor) and lo.numel() else None,
        observed_max=_finite(float(hi.max())) if isinstance(hi, torch.Tensor) and hi.numel() else None,
        enabled=bool(getattr(obs, "fake_quant_enabled", True)),
    )


class _Recorder:
    """Wraps one observer's ``fake_quant`` for one forward: its inputs' range, clipping and noise."""

    def __init__(self, obs, input_ptrs: set[int]) -> None:
        self.obs, self.calls, self.numel, self.clipped = obs, 0, 0, 0
        self.input_ptrs, self.quantizes_input, self.out_ptrs, self.outs = input_ptrs, False, set(), []
        self.lo, self.hi = math.inf, -math.inf
        self.signal = self.noise = 0.0
        self.values: list[torch.Tensor] = []
        self.clip_known = False
        self.original = obs.fake_quant

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.original(x)
        obs = self.obs
        xd = x.detach()
        if isinstance(out, torch.Tensor):  # held until the pass ends, so no address is reused
            self.out_ptrs.add(out.data_ptr())
            self.outs.append(out)
        if xd.is_floating_point() and xd.numel():
            self.quantizes_input |= xd.data_ptr() in self.input_ptrs
            self.calls += 1
            self.numel += xd.numel()
            self.lo, self.hi = min(self.lo, float(xd.min())), max(self.hi, float(xd.max()))
            xf, of = as_float(xd), as_float(out)
            self.signal += float((xf**2).sum())
            self.noise += float(((xf - of) ** 2).sum())
            scale, zp = _qparams(obs)
            dtype = getattr(obs, "dtype", None)
            if scale is not None and zp is not None and dtype is not None:
                axis = getattr(obs, "channel_axis", None)
                s, z = _broadcast(scale, xd, axis), _broadcast(zp.to(torch.float32), xd, axis)
                q = torch.round(xd.float() / s) + z
                self.clipped += int(((q < dtype.qmin) | (q > dtype.qmax)).sum())
                self.clip_known = True
            flat = xd.flatten().float()
            if flat.numel() > _MAX_VALUES:
                # float32 linspace rounds its last index past the end beyond 2**24 elements (a
                # 49152 x 576 embedding table): clamped, so smaller inputs pick what they did before
                flat = flat[torch.linspace(0, flat.numel() - 1, _MAX_VALUES).long().clamp_(max=flat.numel() - 1)]
            self.values.append(flat)
        return out

    def fill(self, site: Site) -> None:
        site.calls = self.calls
        if not self.calls:
            return
        site.input_min, site.input_max = self.lo, self.hi
        site.clipped_fraction = self.clipped / self.numel if self.clip_known else None
        if self.noise == 0.0:
            site.local_sqnr_db = math.inf
        elif self.signal > 0.0:
            site.local_sqnr_db = 10.0 * math.log10(self.signal / self.noise)
        lo, hi, split = resolved_range(torch.cat(self.values))
        site.resolved_min, site.resolved_max, site.split = lo, hi, split
        if site.scale and not site.per_channel and hi > lo:
            site.resolved_levels = (hi - lo) / site.scale


def resolved_range(values: torch.Tensor, gap_fraction: float = CLUSTER_GAP_FRACTION) -> tuple[float, float, bool]:
    """(min, max, split) of the values a site must resolve: all of them, or -- when the largest
    gap between sorted values exceeds ``gap_fraction`` of their range (e.g. logits plus a -120
    mask fill) -- the larger of the two clusters that gap separates."""
    v = torch.sort(values.flatten().float()).values
    lo, hi = float(v[0]), float(v[-1])
    if v.numel() < 3 or hi <= lo:
        return lo, hi, False
    gaps = v[1:] - v[:-1]
    i = int(torch.argmax(gaps))
    if float(gaps[i]) <= gap_fraction * (hi - lo):
        return lo, hi, False
    below, above = v[: i + 1], v[i + 1 :]
    main = below if below.numel() >= above.numel() else above
    return float(main[0]), float(main[-1]), True


def observer_sites(root: torch.nn.Module) -> list[tuple[str, Any]]:
    """(path, observer) of every distinct tico observer under ``root``, in module order."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    seen, found = set(), []
    for path, module in root.named_modules():
        if isinstance(module, ObserverBase) and id(module) not in seen:
            seen.add(id(module))
            found.append((path, module))
    return found


def _gain(off: float, base: float) -> float:
    if off == base:  # both +inf included
        return 0.0
    return off - base


def output_with_site_off(root: torch.nn.Module, path: str, obs, output):
    """``output()`` with one site's fake-quant off (``set_fake_quant_enabled``), or, where tico asks for an
    IdentityObserver float policy instead (harness/diagnosis/float_policy.py), with one in its place."""
    obs.set_fake_quant_enabled(False)
    try:
        return output()
    except ValueError as exc:
        if not refuses_disabled_fake_quant(exc):
            raise
    finally:
        obs.set_fake_quant_enabled(True)
    try:
        with identity_observers(root, [path]):
            return output()
    except ValueError as exc:  # tico supports no such combination (a float site between affine ones)
        raise NotSwitchable(str(exc).strip().splitlines()[0]) from None


class NotSwitchable(Exception):
    """tico refuses both a disabled fake-quant and an IdentityObserver at the site: it runs with it only."""


def attribute(
    pipeline,
    *,
    max_sites: int = 64,
    sample_name: str = "default",
    only: set[str] | None = None,
    with_submodules: bool = True,
) -> Attribution:
    """Leave-one-out attribution of ``pipeline``'s QUANT output error to its fake-quant sites, on a
    private copy of the quantized tree (the shared artifact is never touched). ``only``: evaluate
    just these site paths (another run's sites, for a like-for-like comparison); ``with_submodules``
    False skips the per-submodule table (two forwards plus one call per wrapper)."""
    from tico.quantization.wrapq.control import iter_quantization_sites

    sample = pipeline.sample(sample_name)
    reference = select_valid(pipeline.output("reference", sample_name), sample.valid_tokens)
    quantized = pipeline.quantized  # the shared stages are built (and timed) elsewhere
    started = time.perf_counter()
    twin = copy.deepcopy(quantized)
    observers = observer_sites(twin)
    tico_ids = {id(site.observer) for site in iter_quantization_sites(twin)}
    walked_ids = {id(obs) for _, obs in observers}
    not_in_tico = [path for path, obs in observers if id(obs) not in tico_ids]
    not_walked = sorted(site.path for site in iter_quantization_sites(twin) if id(site.observer) not in walked_ids)

    def output() -> torch.Tensor:
        with torch.no_grad():
            return select_valid(pipeline.case.output(sample.call(twin)).detach(), sample.valid_tokens)

    sites = [_site_facts(path, obs) for path, obs in observers]
    leaves, _ = compat.tree_flatten((tuple(sample.args), dict(sample.kwargs)))
    input_ptrs = {leaf.data_ptr() for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.numel()}
    recorders = [_Recorder(obs, input_ptrs) for _, obs in observers]
    for (_, obs), recorder in zip(observers, recorders):
        obs.fake_quant = recorder
    try:
        with torch.no_grad():
            raw = pipeline.case.output(sample.call(twin)).detach()
        output_ptr = raw.data_ptr()
        as_is = select_valid(raw, sample.valid_tokens)
    finally:
        for _, obs in observers:
            del obs.fake_quant
    for site, recorder in zip(sites, recorders):
        recorder.fill(site)
        if output_ptr in recorder.out_ptrs:
            site.boundary = "output"
        elif recorder.quantizes_input:
            site.boundary = "input"
    del recorders
    if not torch.equal(output(), as_is):
        raise RuntimeError("the private copy's QUANT output is not reproducible from one forward to the next")
    base_sqnr, base_peir = sqnr_db(reference, as_is), peir(reference, as_is)

    candidates = [i for i, s in enumerate(sites) if s.enabled and s.calls and (only is None or s.path in only)]
    candidates.sort(key=lambda i: sites[i].local_sqnr_db if sites[i].local_sqnr_db is not None else math.inf)
    chosen = candidates[:max_sites]
    forwards = 2
    timed = 0.0
    for i in chosen:
        path, obs = observers[i]
        t0 = time.perf_counter()
        try:
            off = output_with_site_off(twin, path, obs, output)
        except NotSwitchable as why:
            sites[i].not_switchable = str(why)
            continue
        timed += time.perf_counter() - t0
        forwards += 1
        site = sites[i]
        site.evaluated = True
        site.changed = not torch.equal(off, as_is)
        site.sqnr_db_off, site.peir_off = sqnr_db(reference, off), peir(reference, off)
        site.gain_db = _gain(site.sqnr_db_off, base_sqnr)
        site.peir_gain = base_peir - site.peir_off

    def rank(s: Site) -> tuple:
        if s.evaluated:
            return (0, -(s.gain_db if s.gain_db is not None and not math.isnan(s.gain_db) else -math.inf), s.path)
        return (1, s.local_sqnr_db if s.local_sqnr_db is not None else math.inf, s.path)

    sites.sort(key=rank)
    submodules, submodules_refused = [], None
    try:
        submodules = submodule_errors(quantized, sample) if with_submodules else []
    except FloatRunRefused as why:
        submodules_refused = str(why)
    return Attribution(
        sample=sample_name,
        sqnr_db=base_sqnr,
        peir=base_peir,
        sites=sites,
        evaluated=sum(1 for s in sites if s.evaluated),
        capped=len(candidates) > len(chosen),
        max_sites=max_sites,
        forwards=forwards,
        seconds=time.perf_counter() - started,
        seconds_per_forward=timed / len(chosen) if chosen else 0.0,
        not_in_tico_sites=not_in_tico,
        not_walked=not_walked,
        submodules=submodules,
        submodules_refused=submodules_refused,
    )


def table_rows(attribution: Attribution, limit: int | None = None) -> list[list[Any]]:
    """Rows for printing: site, gain dB, scale, zp, range (input on the sample), clipped %, boundary."""
    rows = []
    for s in attribution.sites[:limit]:
        rng = "" if s.input_min is None else f"{s.input_min:.4g}..{s.input_max:.4g}"
        rows.append(
            [
                s.path,
                "not evaluated" if s.gain_db is None else f"{s.gain_db:.2f}",
                "" if s.scale is None else f"{s.scale:.4g}",
                "" if s.zero_point is None else s.zero_point,
                rng,
                "" if s.clipped_fraction is None else f"{100.0 * s.clipped_fraction:.2f}",
                s.boundary or "",
            ]
        )
    return rows
