"""Building blocks the pipeline, the checks and the diagnoses share: memoised stages, accuracy metrics,
tensor comparison, tico's lifecycle operations, and what a wrapper feeds its submodules."""
