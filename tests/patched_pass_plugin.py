"""pytest plugin (``-p tests.patched_pass_plugin``) that patches tico's PropagateQParamForward in
memory (tests/pass_defects.py), for subprocess runs that must show a warm cache reports the
defect exactly as a cold run (tests/test_cache_soundness.py)."""

from __future__ import annotations

from tico.quantization.passes import propagate_qparam_forward as _forward

from tests.pass_defects import dropping_split_output_qparams

_forward.PropagateQParamForward.call = dropping_split_output_qparams(_forward.PropagateQParamForward.call)
