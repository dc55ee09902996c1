"""Where a case's quantization error comes from: attribution per site, per group, per submodule,
deployed, and against random weights."""
