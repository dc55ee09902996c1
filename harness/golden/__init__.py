"""Golden tensors: stored, compared portably across CPUs, with the platform facts and the seeded
defects that measure what the gate must catch."""
