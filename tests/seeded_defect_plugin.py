"""pytest plugin (``-p tests.seeded_defect_plugin``) that seeds the harness.golden.defects defect named
by WRAPQ_SEEDED_DEFECT into every case's quantized model, for subprocess runs that must show
the golden gate catches it under another kernel selection (tests/test_portable_golden.py)."""

from __future__ import annotations

import os

from harness.golden import defects
from harness.pipeline import Pipeline

_quantized = Pipeline.quantized.fget


def _seeded(self: Pipeline):
    root = _quantized(self)
    if not getattr(self, "_seeded_defect", None):
        self._seeded_defect = "applying"
        self._seeded_defect = defects.apply(os.environ["WRAPQ_SEEDED_DEFECT"], self) or "n/a"
    return root


Pipeline.quantized = property(_seeded)
