"""A run's records: per-item results and their file format, the command that reruns an item, and the
harness's own cost."""
