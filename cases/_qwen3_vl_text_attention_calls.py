"""The Qwen3-VL text attention's decode call contract (the call_contract check): the past as the
HF Cache-like objects ``QuantQwen3VLTextAttention`` reads besides its static (K, V) tuple. Its update
path takes ``update()``'s returned tensors, or, when a cache returns none, finds the layer's K/V in
the layouts of other transformers versions (``k``/``v`` on the cache, ``key_cache``/``value_cache``
lists, ``layers[i]`` as a tuple or with ``keys``/``values``, ``key``/``value`` or ``k``/``v``), and
calls ``update`` with fewer arguments when a cache's signature is older. Each layout holds the case's
past and must answer the decode step as Hugging Face's attention answers it from a DynamicCache; a
past with no ``update`` and a cache whose layer cannot be found are refused."""

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
    ]
