"""Limits for profile 'static_runtime', proposed by python -m harness limits from clean runs and reviewed.

Each entry replaces those settings fields of the case on this profile (the other fields
stay as the case states them); its source says what was measured."""

LIMITS = {
}
