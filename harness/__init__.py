"""wrapq validation harness: generic checks for TICO PTQ wrappers against Hugging Face modules."""

from harness.case import (
    Built,
    Case,
    CaseDefinitionError,
    CaseInputs,
    ExportCapability,
    GoldenTolerance,
    MaskCapability,
    MaskProbe,
    RotaryCapability,
    RotaryTables,
    Sample,
    Thresholds,
    first_tensor,
    whole_module_export,
)
from harness.checks.export_contract import calib_mode_adapter
from harness.expectations import Expected

__all__ = [
    "Built",
    "Case",
    "CaseDefinitionError",
    "CaseInputs",
    "Expected",
    "ExportCapability",
    "GoldenTolerance",
    "MaskCapability",
    "MaskProbe",
    "RotaryCapability",
    "RotaryTables",
    "Sample",
    "Thresholds",
    "calib_mode_adapter",
    "first_tensor",
    "whole_module_export",
]
