"""The pytest side of a run: options, per-process state, collection, items, results and the end of a
run."""
