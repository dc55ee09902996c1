"""tico's ExportedProgram -> Circle conversion as the harness runs it: FX code generation deferred
(the same bytes, less time), the quantized program tico's passes produce captured at tico's own
qparam check, unsupported operators named, and the audit of that program (missing qparams,
qparams replaced by later passes). The Circle cache fingerprints exactly this code."""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from harness import compat
from harness.circle.consistency import overwritten_qparams
from harness.circle.missing_qparams import AuditResult, audit_exported_program
from harness.circle.records import attribute_observers, observer_fake_quants, recording_biases, recording_folds
from harness.circle.requantized import requantized_unapplied


@contextmanager
def _capture_quantized_program() -> Iterator[dict[str, Any]]:
    """tico runs its quantization passes on a program it creates internally, then calls
    check_missing_qparam on it: intercept that call to audit the very same graph."""
    import tico.utils.convert as convert_module

    captured: dict[str, Any] = {}
    original = convert_module.check_missing_qparam

    def capture(program: Any, **kwargs: Any) -> None:
        captured["program"] = program
        captured["ignored"] = kwargs.get("ignore_targets") or set()

    convert_module.check_missing_qparam = capture
    try:
        yield captured
    finally:
        convert_module.check_missing_qparam = original


@contextmanager
def _deferred_fx_codegen() -> Iterator[None]:
    """Skip the whole-graph code generation tico's passes trigger and never use.

    After its decompositions, tico's passes call ``GraphModule.recompile()`` after every
    change (239 times in one conversion of llama_decoder_layer_decode): Python source generated
    and compiled for the whole graph each time, about 40% of conversion time, though no pass reads that code.
    torch's own ``_LazyGraphModule`` (what inductor uses for the same reason) turns
    ``recompile()`` into a mark and generates the code only when ``code`` or ``forward`` is
    used. The decomposed program's graph module is swapped for a lazy one. The Circle bytes
    and the captured quantized graph are the same (tests/test_deferred_codegen.py compares
    them; benchmarks/export_costs.py does so for every case). The final graph is compiled
    once at the end, so a graph whose code cannot be generated still fails conversion."""
    lazy_api = compat.lazy_graph_module()
    if lazy_api is None:  # another torch: convert as tico does, only slower (compat.problems() says so)
        yield
        return
    _LazyGraphModule, _use_lazy_graph_module = lazy_api
    import tico.utils.convert as convert_module

    original = convert_module.traced_run_decompositions
    decomposed: list[Any] = []

    def decompose_then_defer(program: Any) -> Any:
        program = original(program)
        eager = program.graph_module
        lazy = _LazyGraphModule.from_graphmodule(eager)
        lazy.meta.update(eager.meta)
        compat.replace_program_graph_module(program, lazy)
        decomposed.append(program)
        return program

    convert_module.traced_run_decompositions = decompose_then_defer
    try:
        with _use_lazy_graph_module(True):
            yield
        for program in decomposed:
            _LazyGraphModule.force_recompile(program.graph_module)
    finally:
        convert_module.traced_run_decompositions = original


@contextmanager
def counting_codegens() -> Iterator[list[int]]:
    """Count whole-graph code generations (calls of GraphModule.recompile proper; a lazy
    module's recompile() only marks the graph, and its real one calls this): how the deferral
    is measured (benchmarks/export_costs.py) and tested."""
    original = torch.fx.GraphModule.recompile
    count = [0]

    def counted(self: Any) -> Any:
        count[0] += 1
        return original(self)

    torch.fx.GraphModule.recompile = counted
    try:
        yield count
    finally:
        torch.fx.GraphModule.recompile = original


class _UnsupportedOperatorLog(logging.Handler):
    """Collects the operator names tico's check_unsupported_target logs before it raises."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.operators: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.match(r"NOT SUPPORTED OPERATOR\s*\n\s*\(op\) (\S+)", str(record.msg))
        if match:
            self.operators.append(match.group(1))


@contextmanager
def _naming_unsupported_operators() -> Iterator[None]:
    """tico refuses a graph with an operator it cannot convert with one generic line, "NOT
    SUPPORTED OPERATOR IN GRAPH MODULE", and names the operators only in its log
    (utils/convert.py check_unsupported_target). The same error is raised again, of the same
    type, with those names (and counts) on its first line, so a stage failure (and an
    expectation matching it) says which operator was refused."""
    from tico.utils.errors import NotYetSupportedError

    log = _UnsupportedOperatorLog()
    logger = logging.getLogger("tico.utils.convert")
    logger.addHandler(log)
    try:
        yield
    except NotYetSupportedError as exc:
        if not log.operators:
            raise
        counts = {op: log.operators.count(op) for op in dict.fromkeys(log.operators)}
        named = ", ".join(f"{op} x{n}" for op, n in counts.items())
        raise type(exc)(f"{exc}: {named}") from exc
    finally:
        logger.removeHandler(log)


def convert_with_audit(program: Any, defer_codegen: bool = True) -> tuple[bytes, AuditResult]:
    """Convert a private copy (tico's passes mutate the program they are given)."""
    from tico.utils.convert import convert_exported_module_to_circle

    observers = observer_fake_quants(program)
    deferral = _deferred_fx_codegen() if defer_codegen else contextlib.nullcontext()
    with (
        _capture_quantized_program() as captured,
        recording_folds() as applied,
        recording_biases() as biases,
        deferral,
        torch.no_grad(),
        _naming_unsupported_operators(),
    ):
        binary = convert_exported_module_to_circle(copy.deepcopy(program))
    if "program" not in captured:
        return binary, AuditResult()
    audit = audit_exported_program(captured["program"])
    audit.attribution_refused = attribute_observers(applied, observers)
    audit.redundant = [record for record in applied if record["redundant"]]
    applied = [record for record in applied if not record["redundant"]]
    audit.applied = applied
    audit.overwritten, audit.replaced_nodes = overwritten_qparams(applied, captured["program"])
    audit.requantized = requantized_unapplied(applied, captured["program"])
    audit.quantized_biases = biases
    return binary, audit
