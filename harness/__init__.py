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

__all__ = [
    "Built",
    "Case",
    "CaseDefinitionError",
    "CaseInputs",
    "ExportCapability",
    "GoldenTolerance",
    "MaskCapability",
    "MaskProbe",
    "RotaryCapability",
    "RotaryTables",
    "Sample",
    "Thresholds",
    "first_tensor",
    "whole_module_export",
]
