"""wrapq validation harness: generic checks for TICO PTQ wrappers against Hugging Face modules.

What a case file or an out-of-tree check needs is exported here (README "Add a case" and
"Add a check"); the rest of the package is the harness's own."""

from harness.checks.base import Check, CheckResult, Metric, requires_capability
from harness.checks.export_contract import calib_mode_adapter
from harness.golden.portable import GoldenTolerance
from harness.model.algorithm import AlgorithmCapability, AlgorithmRecord, WeightGrid, capture_linear_inputs
from harness.model.case import Case, CaseDefinitionError, ProfileLimits, first_tensor
from harness.model.case_parts import (
    Built,
    CallContractCapability,
    CallProbe,
    CaseInputs,
    ExportCapability,
    LanguageModelCapability,
    MaskCapability,
    MaskProbe,
    PreparedExport,
    RotaryCapability,
    RotaryTables,
    RotationHandoffCapability,
    Sample,
    whole_module_export,
)
from harness.model.check_settings import merged as merged_settings
from harness.model.expectations import Expected
from harness.model.sweep import Sweep
from harness.primitives.capture import first_call_kwarg
from harness.primitives.gptq_match import find_on_prepared as gptq_quantizers_on_prepared
from harness.primitives.gptq_match import handoff as inject_gptq_with_key_table
from harness.primitives.lifecycle_ops import unwrap
from harness.tico_facts.findings_data import expect, expect_on

__all__ = [
    "Built",
    "Case",
    "Check",
    "CheckResult",
    "CaseDefinitionError",
    "CaseInputs",
    "Expected",
    "ExportCapability",
    "GoldenTolerance",
    "LanguageModelCapability",
    "MaskCapability",
    "MaskProbe",
    "Metric",
    "PreparedExport",
    "ProfileLimits",
    "RotaryCapability",
    "RotaryTables",
    "RotationHandoffCapability",
    "Sample",
    "Sweep",
    "calib_mode_adapter",
    "first_call_kwarg",
    "first_tensor",
    "merged_settings",
    "requires_capability",
    "unwrap",
    "whole_module_export",
]
__all__ += ["AlgorithmCapability", "AlgorithmRecord", "WeightGrid", "capture_linear_inputs", "expect", "expect_on"]
__all__ += ["gptq_quantizers_on_prepared", "inject_gptq_with_key_table"]
__all__ += ["CallContractCapability", "CallProbe"]
