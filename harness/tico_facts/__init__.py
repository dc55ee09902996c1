"""What the harness knows about the tico under test: which tico it is, its findings and their status,
version drift and which wrappers the cases reach."""
