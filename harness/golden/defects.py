"""Seeded wrapper defects that any case can receive, for measuring what the golden gate must
catch (scripts/golden_noise.py) and for the tests that prove it does.

Each defect mutates a quantized wrapper tree in place, the way a real wrapper bug would leave
it: an output observer whose scale is a little off, a zero point off by one level, a weight
that is never fake-quantized. ``apply`` returns what it changed, or None when the case has
nothing the defect can touch (e.g. no weight observer); the caller reports that as n/a.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.primitives.observer_trace import producing_observers


def _output_observer(root, output_of) -> torch.nn.Module | None:
    """The per-tensor observer (in ``root``) whose fake-quant produced the output, or None."""
    found = producing_observers(root, {"out": output_of}).get("out")
    if found is None:
        return None
    obs = root.get_submodule(found[0])
    scale = getattr(obs, "_cached_scale", None)
    return obs if isinstance(scale, torch.Tensor) and scale.numel() == 1 else None


def _rescale(obs, factor: float, what: str) -> str:
    obs.load_qparams(obs._cached_scale * factor, obs._cached_zp)
    return f"{obs.name}: {what}"


def output_scale_2pct(root, output_of) -> str | None:
    """The output observer's scale 2% too large (a mis-derived range)."""
    obs = _output_observer(root, output_of)
    return None if obs is None else _rescale(obs, 1.02, "scale x1.02")


def output_scale_one_level(root, output_of) -> str | None:
    """The output observer computed with one quantization level fewer (qmax - 1)."""
    obs = _output_observer(root, output_of)
    if obs is None:
        return None
    levels = obs.dtype.qmax - obs.dtype.qmin
    return _rescale(obs, levels / (levels - 1), f"{levels - 1} levels instead of {levels}")


def output_zp_off_by_one(root, output_of) -> str | None:
    """The output observer's zero point one level off (a rounding or sign slip)."""
    obs = _output_observer(root, output_of)
    if obs is None:
        return None
    zp = obs._cached_zp
    shifted = zp - 1 if int(zp) >= obs.dtype.qmax else zp + 1
    obs.load_qparams(obs._cached_scale, shifted)
    return f"{obs.name}: zero point {int(zp)} -> {int(shifted)}"


def weight_fake_quant_skipped(root, output_of) -> str | None:
    """One weight's fake-quant is skipped (the float weight is used in QUANT): the first weight
    observer, in module order, whose skip changes the output at all (wrappers that cache their
    quantized weights at convert time, or weights off the sample's path, are passed over)."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    with torch.no_grad():
        before = output_of(root).clone()
        for path, obs in root.named_modules():
            if not isinstance(obs, ObserverBase) or path.rsplit(".", 1)[-1] != "obs_weight":
                continue
            obs.fake_quant = lambda x: x
            if not torch.equal(output_of(root), before):
                return f"{path}: fake_quant skipped"
            del obs.fake_quant
    return None


def weight_range_per_tensor(root, output_of) -> str | None:
    """Every per-channel weight observer quantizes with the whole tensor's range (min and max over
    all channels, as a per-tensor observer would). Trained weights' outlier rows set the step for
    every row, but iid weights of real widths lose too (their rows spread ~1.3x): measured on
    llama_mlp_w8a16_real_l27, 16.6 dB real vs 3.3 dB random (see REAL_WEIGHT_DEFECTS below)."""
    from tico.quantization.wrapq.observers.base import ObserverBase

    changed = []
    with torch.no_grad():
        for path, obs in root.named_modules():
            if (
                not isinstance(obs, ObserverBase)
                or path.rsplit(".", 1)[-1] != "obs_weight"
                or getattr(obs, "channel_axis", None) is None
                or getattr(obs, "min_val", None) is None
            ):
                continue
            if obs.min_val.numel() < 2 or not torch.isfinite(obs.min_val).all():
                continue
            obs.min_val.fill_(float(obs.min_val.min()))
            obs.max_val.fill_(float(obs.max_val.max()))
            locked = obs._qparams_locked
            obs._qparams_locked = False
            obs.load_qparams(*obs.compute_qparams(), lock=locked)
            changed.append(path)
    return f"{len(changed)} weight observer(s) quantize with the tensor-wide range" if changed else None


DEFECTS: dict[str, Callable] = {
    "output_scale_2pct": output_scale_2pct,
    "output_scale_one_level": output_scale_one_level,
    "output_zp_off_by_one": output_zp_off_by_one,
    "weight_fake_quant_skipped": weight_fake_quant_skipped,
}

PERCENTILE_CLIP = 0.1  # percent of each tail the percentile defect drops


def _percentile_update_stats(self, x: torch.Tensor) -> None:
    """MinMaxObserver._update_stats with each per-tensor batch range cut to its 0.1 / 99.9
    percentiles (kthvalue of the flattened batch); per-channel (weight) observers unchanged."""
    from tico.quantization.wrapq.observers.minmax import channelwise_minmax

    with torch.no_grad():
        if self.channel_axis is None:
            flat = x.detach().flatten().float()
            k = max(1, int(flat.numel() * PERCENTILE_CLIP / 100))
            curr_min = flat.kthvalue(k).values
            curr_max = flat.kthvalue(max(1, flat.numel() - k + 1)).values
        else:
            curr_min, curr_max = channelwise_minmax(x, self.channel_axis)
        self.min_val = torch.minimum(self.min_val, curr_min)
        self.max_val = torch.maximum(self.max_val, curr_max)


def activation_range_percentile(monkeypatch) -> str:
    """Seed, before calibration, a min/max activation observer that clips outliers: every per-tensor
    MinMaxObserver keeps the 0.1..99.9 percentile range of each calibration batch instead of its min
    and max. Random inputs have no outliers to lose; trained models' activations (massive residual
    dimensions, attention sinks) do. ``monkeypatch`` is pytest's (or anything with ``setattr``)."""
    from tico.quantization.wrapq.observers.minmax import MinMaxObserver

    monkeypatch.setattr(MinMaxObserver, "_update_stats", _percentile_update_stats)
    return f"per-tensor MinMaxObserver ranges cut to the {PERCENTILE_CLIP}..{100 - PERCENTILE_CLIP} percentiles"


def weight_channel_axis_transposed(monkeypatch) -> str:
    """Seed, before wrapping, a QuantLinear whose per-channel weight observer reduces and
    fake-quantizes along axis 1 (input features) instead of axis 0 (output rows): the transposed
    layout convention (HF's GPT-2 ``Conv1D`` stores (in, out)) applied to an nn.Linear. Every
    column then takes the range of its widest row: iid weights have no wide rows and barely move;
    a trained checkpoint's outlier rows set the step of every other row."""
    from tico.quantization.wrapq.wrappers.nn.quant_linear import QuantLinear

    original = QuantLinear.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.obs_weight.channel_axis = 1

    monkeypatch.setattr(QuantLinear, "__init__", init)
    return "QuantLinear weight observers per input feature (axis 1) instead of per output row (axis 0)"


# Weight defects for the real_weights profile, applied to a quantized tree; kept apart from DEFECTS,
# whose members every golden must catch (scripts/golden_noise.py). weight_range_per_tensor is NOT
# one only real weights expose: random weights of the same shapes expose it too (numbers in
# docs/real-weights.md). weight_channel_axis_transposed (above, seeded before wrapping) is the one
# random weights hide (tests/test_real_weights.py).
REAL_WEIGHT_DEFECTS: dict[str, Callable] = {
    "weight_range_per_tensor": weight_range_per_tensor,
}


def apply(name: str, pipeline) -> str | None:
    """Seed defect ``name`` into ``pipeline``'s quantized tree before any output is computed."""
    sample = pipeline.sample("default")
    return {**DEFECTS, **REAL_WEIGHT_DEFECTS}[name](
        pipeline.quantized, lambda root: pipeline.case.output(sample.call(root))
    )
