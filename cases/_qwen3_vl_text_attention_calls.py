"""The Qwen3-VL text attention's decode call contract (the call_contract check): the past as the
HF Cache-like objects ``QuantQwen3VLTextAttention`` reads besides its static (K, V) tuple. Its update
path takes ``update()``'s returned tensors, or, when a cache returns none, finds the layer's K/V in
the layouts of other transformers versions (``k``/``v`` on the cache, ``key_cache``/``value_cache``
lists, ``layers[i]`` as a tuple or with ``keys``/``values``, ``key``/``value`` or ``k``/``v``), and
calls ``update`` with fewer arguments when a cache's signature is older. Each layout holds the case's
past and must answer the decode step as Hugging Face's attention answers it from a DynamicCache; a
past with no ``update`` and a cache whose layer cannot be found are refused. The mask forms its
normalization documents (bool or integer keep masks, 2-D to 4-D, longer key spans and more query rows
sliced), on a step whose first past key is masked out, answer as HF answers the additive form; a mask of
another rank, dtype or head count, or shorter than the keys, is refused."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness import Built, CallProbe, Sample


class _OlderCache:
    """A cache that stores each layer's K/V in ``layout`` and whose ``update`` returns ``returns``
    ("nothing", "itself" or "tensors"); ``short_signature``: ``update(k, v)`` only."""

    def __init__(self, past, layer_idx: int, layout: str, returns: str = "nothing", short_signature=False):
        self.layout, self.returns, self.layer_idx = layout, returns, layer_idx
        self._k, self._v = (t.clone() for t in past)
        self._publish()
        if short_signature:
            self.update = self._update_short

    def _publish(self) -> None:
        k, v = self._k, self._v
        layer = {
            "layers_keys_values": SimpleNamespace(keys=k, values=v),
            "layers_key_value": SimpleNamespace(key=k, value=v),
            "layers_k_v": SimpleNamespace(k=k, v=v),
            "layers_tuple": (k, v),
        }.get(self.layout)
        slots = [None] * self.layer_idx
        if layer is not None:
            self.layers = slots + [layer]
        elif self.layout == "key_cache":
            self.key_cache, self.value_cache = slots + [k], slots + [v]
        elif self.layout == "k_v":
            self.k, self.v = k, v

    def update(self, new_k, new_v, layer_idx, cache_kwargs=None):
        return self._update_short(new_k, new_v)

    def _update_short(self, new_k, new_v):
        self._k, self._v = torch.cat([self._k, new_k], 2), torch.cat([self._v, new_v], 2)
        self._publish()
        return {"nothing": None, "itself": self, "tensors": (self._k, self._v)}[self.returns]


def text_attention_decode_probes(built: Built, *, hf_decode) -> list[CallProbe]:
    """``hf_decode(reference, sample)``: the case's own HF call for a decode sample."""
    sample = built.inputs.evaluation["default"]
    past = sample.kwargs["past_key_values"]
    layer_idx = built.module.layer_idx

    def with_cache(label, **cache_kwargs):
        def call(m):
            cache = _OlderCache(past, layer_idx, **cache_kwargs)
            return Sample(args=sample.args, kwargs={**sample.kwargs, "past_key_values": cache}).call(m)

        return CallProbe(label, call, reference=lambda hf: hf_decode(hf, sample), pick=lambda out: [out[0]])

    def refused(label, cache, refusal):
        return CallProbe(
            label,
            lambda m: Sample(args=sample.args, kwargs={**sample.kwargs, "past_key_values": cache}).call(m),
            refusal=refusal,
        )

    masks = _mask_probes(sample, lambda hf, changed: hf_decode(hf, changed))
    layouts = ("layers_keys_values", "layers_key_value", "layers_k_v", "layers_tuple", "key_cache", "k_v")
    return [
        with_cache("a cache whose update returns the K/V", layout="layers_keys_values", returns="tensors"),
        with_cache("a cache whose update returns itself", layout="layers_keys_values", returns="itself"),
        with_cache("an update(k, v) of an older signature", layout="key_cache", short_signature=True),
        *(with_cache(f"a cache holding the layer as {layout}", layout=layout) for layout in layouts),
        refused("a past with no update()", object(), "RuntimeError: past_key_values must be a static KV tuple"),
        refused(
            "a cache whose layer K/V cannot be found",
            _OlderCache(past, layer_idx, layout="none"),
            "RuntimeError: Cache update did not return key/value tensors",
        ),
        *masks,
    ]


FILL = -120.0  # tico's default attention_mask_fill_value


def _mask_probes(sample: Sample, hf_decode) -> list[CallProbe]:
    """The decode step with its first past key masked out, in each form the wrapper normalizes."""
    additive = sample.kwargs["attention_mask"].clone()  # (B, 1, K)
    additive[..., 0] = FILL
    keep = additive == 0
    masked = Sample(args=sample.args, kwargs={**sample.kwargs, "attention_mask": additive})
    batch, _, keys = additive.shape

    def call(mask):
        return lambda m: Sample(args=sample.args, kwargs={**sample.kwargs, "attention_mask": mask}).call(m)

    def form(label, mask):
        return CallProbe(label, call(mask), reference=lambda hf: hf_decode(hf, masked), pick=lambda out: [out[0]])

    def refused(label, mask, refusal):
        return CallProbe(label, call(mask), refusal=refusal)

    return [
        form("additive (B, 1, K) mask", additive),
        form("(B, 1, K) int64 keep mask", keep.long()),
        form("(B, K) bool keep mask", keep[:, 0]),
        form("(B, 1, 1, K) bool keep mask", keep[:, None]),
        form("additive mask over more keys (sliced)", torch.cat([additive, torch.zeros(batch, 1, 2)], -1)),
        form("additive mask with more query rows (last kept)", torch.cat([torch.zeros(batch, 2, keys), additive], 1)),
        refused("a 5-D mask", additive[None, None], "RuntimeError: Unsupported attention_mask rank"),
        refused("a mask over fewer keys", additive[..., 1:], "RuntimeError: attention_mask key length is shorter"),
        refused("a mask with no query rows", additive[:, :0], "RuntimeError: attention_mask query length"),
        refused("a per-head mask", torch.cat([additive, additive], 1)[:, :, None], "RuntimeError: Per-head"),
        refused("a complex mask", additive.to(torch.complex64), "RuntimeError: Unsupported attention_mask dtype"),
    ]
