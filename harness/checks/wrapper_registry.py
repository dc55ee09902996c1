"""The HF module class resolves to the expected wrapper through tico's registry, so prepare()
wraps it (seed 2's "no quantization wrapper for X" is this failing); the class is named."""

from harness.checks.base import Check, CheckResult
from harness.primitives.lifecycle_ops import unwrap


def run(pipeline) -> CheckResult:
    from tico.quantization.wrapq.wrappers.registry import lookup

    result = CheckResult()
    fp_cls = type(pipeline.built.module)
    wrapper_cls = lookup(fp_cls)
    result.evidence["module_class"] = f"{fp_cls.__module__}.{fp_cls.__qualname__}"
    result.evidence["wrapper_class"] = f"{wrapper_cls.__module__}.{wrapper_cls.__qualname__}" if wrapper_cls else None
    expected = pipeline.case.expected_wrapper
    if wrapper_cls is None:
        result.fail(
            f"no quantization wrapper registered for {fp_cls.__qualname__} ({fp_cls.__module__}): "
            "prepare() cannot wrap it"
        )
        return result
    if expected is not None and wrapper_cls.__name__ != expected:
        result.fail(f"{fp_cls.__qualname__} resolves to {wrapper_cls.__name__}, expected {expected}")
    used = type(unwrap(pipeline.quantized))
    if used is not wrapper_cls:
        result.fail(
            f"prepare() wrapped {fp_cls.__qualname__} with {used.__name__}, registry says {wrapper_cls.__name__}"
        )
    if expected is None:
        result.notes.append(f"wrapper class not asserted by the case; resolved to {wrapper_cls.__name__}")
    return result


CHECK = Check(name="wrapper_registry", run=run, description=__doc__.splitlines()[0])
