"""gemma4_vision_encoder, configured like TICO's tiny smoke case, reproduces seed PR 1's numbers."""

import pytest

from cases.gemma4 import VISION_ENCODER
from tests.helpers import run_check

# From the seed PR's smoke summary (six decimals).
SEED_MEAN_ABS_DIFF = 0.079886
SEED_MAX_ABS_DIFF = 0.503346
SEED_PEIR = 0.056661


def test_gemma4_vision_encoder_reproduces_seed_figures():
    result = run_check(VISION_ENCODER, "quant_accuracy")
    assert result.passed, result.problems
    m = result.metrics
    assert m["mean_abs_diff"] == pytest.approx(SEED_MEAN_ABS_DIFF, abs=1e-6)
    assert m["max_abs_diff"] == pytest.approx(SEED_MAX_ABS_DIFF, abs=1e-6)
    assert m["peir"] == pytest.approx(SEED_PEIR, abs=1e-6)
