"""Reuse of a case's leave-one-out attribution when the quantized model executes exactly as before.

Attribution costs one forward per fake-quant site (seconds on the larger tiny cases), and with
nothing changed it computes the same table. The key is built the way the export cache keys an
adapter (harness/export/export_reuse.py): an execution trace of the QUANT model on the attribution
sample -- every dispatched op and the bytes it reads, every Python function that ran with the
globals it names, the module tree with every parameter, buffer and qparam byte, the output
bytes, the torch / tico / transformers versions and tico's installed source -- plus

- the bytes of the Hugging Face reference output the gains are measured against;
- the attribution code as it is in memory (``harness.diagnosis.site_attribution.attribute`` and everything of
  tico and the harness it reaches, including the observers' ``set_fake_quant_enabled`` that
  switches a site off), and the sample and ``max_sites`` asked for.

What is stored is the Attribution itself; the check judges it against the current settings on
every run. Switching one site off runs the same functions as the traced run: in tico 0.3.0 the
only code that runs only when a site is off is the ``return x`` branch inside the observers'
own ``fake_quant`` (observers/affine_base.py, mx.py), which the trace keys. A change that the
trace cannot see (say, a function called only on a value-dependent branch that the sample does
not take) is not seen: ``--no-export-cache`` turns this cache off with the export cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from harness.diagnosis.site_attribution import Attribution, Site, attribute
from harness.diagnosis.submodule_error import SubmoduleError
from harness.export.code_fingerprint import Unfingerprintable, reachable_fingerprint
from harness.export.entry_store import EntryStore, Uncacheable
from harness.export.execution_key import _tensor_digest, execution_key
from harness.primitives.metrics import select_valid

KEY_SCHEMA = "attribution-v4"


class _SampleCall(torch.nn.Module):
    """The QUANT model called on one sample, as the attribution calls it (traced for the key)."""

    def __init__(self, quantized: torch.nn.Module, sample: Any, output: Any) -> None:
        super().__init__()
        self.quantized = quantized
        self._sample = sample
        self._output = output

    def forward(self) -> Any:
        return self._output(self._sample.call(self.quantized))


def _attribution_code_fingerprint() -> str:
    from tico.quantization.wrapq.observers.base import ObserverBase

    try:
        return reachable_fingerprint(
            [
                ("harness.diagnosis.site_attribution.attribute", attribute),
                ("ObserverBase.set_fake_quant_enabled", ObserverBase.set_fake_quant_enabled),
            ]
        )
    except Unfingerprintable as why:
        raise Uncacheable(f"the attribution code cannot be fingerprinted: {why}") from why


def attribution_key(pipeline: Any, max_sites: int, sample_name: str) -> str:
    """sha256 of what ``attribute(pipeline, max_sites, sample_name)`` depends on (module
    docstring). Raises ``Uncacheable`` when something cannot be described exactly."""

    sample = pipeline.sample(sample_name)
    reference = select_valid(pipeline.output("reference", sample_name), sample.valid_tokens)
    execution = execution_key(_SampleCall(pipeline.quantized, sample, pipeline.case.output), ())
    parts = {
        "schema": KEY_SCHEMA,
        "execution": execution,
        "reference": _tensor_digest(reference),
        "valid_tokens": repr(sample.valid_tokens),
        "code": _attribution_code_fingerprint(),
        "max_sites": int(max_sites),
        "sample": sample_name,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _decode(payload: bytes, meta: dict[str, Any]) -> Attribution:
    data = json.loads(payload)
    data["sites"] = [Site(**site) for site in data["sites"]]
    data["submodules"] = [SubmoduleError(**row) for row in data["submodules"]]
    return Attribution(**data)


def cached_attribute(
    pipeline: Any, *, max_sites: int, sample_name: str = "default", cache_dir: Path | None = None
) -> tuple[Attribution, str]:
    """The attribution and how it was obtained: "hit", "miss" (computed and stored), "off",
    "uncacheable: ..." or "not stored: ..."."""
    if cache_dir is None:
        return attribute(pipeline, max_sites=max_sites, sample_name=sample_name), "off"
    store = EntryStore(Path(cache_dir), ".attribution.json", "attribution cache")
    try:
        key = attribution_key(pipeline, max_sites, sample_name)
    except Uncacheable as why:
        return attribute(pipeline, max_sites=max_sites, sample_name=sample_name), f"uncacheable: {why}"
    found, notes = store.lookup(key, _decode, "recomputed")
    if found is not None:
        return found, "hit"
    attribution = attribute(pipeline, max_sites=max_sites, sample_name=sample_name)
    status = "miss" + (f" ({'; '.join(notes)})" if notes else "")
    try:
        store.write(key, json.dumps(dataclasses.asdict(attribution)).encode(), {"schema": KEY_SCHEMA})
    except OSError as why:  # a full or read-only disk costs the reuse, not the case
        status = f"not stored: {why}"
    return attribution, status
