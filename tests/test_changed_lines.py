"""A change inside a function narrowed to the anchors a run must have run to reach it (the first statements
of the blocks holding it): each rule on a source whose answer is known, every change the anchors cannot
bound left whole, and the narrowing checked against what really runs (a run that never ran the anchors
behaves alike on both sides)."""

from __future__ import annotations

import sys
import textwrap
import types

from harness.tico_facts.changed_functions import FUNCTION, MODULE, Change, file_changes
from harness.tico_facts.changed_lines import anchor_spans

BASE = textwrap.dedent(
    """\
    from m.mapping import extract_shape
    import torch


    class Decompose:
        def call(self, nodes, beta):
            out = []
            for node in nodes:
                if node < 0:
                    continue
                if beta == 1:
                    out.append(node)
                elif beta == 0:
                    out.append(extract_shape(node))
                else:
                    out.append(node * beta)
            return out

        def other(self, x):
            return x
    """
)
CALL = "Decompose.call"
FIRST_IN_LOOP = 9  # ``if node < 0:``, the loop body's first statement
ELIF = 13  # ``elif beta == 0:``, the first statement of the first if's else
ELIF_BODY = 14  # ``out.append(extract_shape(node))``
ELSE_BODY = 16  # ``out.append(node * beta)``, the first statement of the elif's else


def _lines(head: str, name: str = CALL) -> frozenset[int] | None:
    found = {c.name: c for c in file_changes("m.py", BASE, head) if c.kind == FUNCTION}
    return found[name].lines


def test_a_change_in_one_branch_narrows_to_that_branch_s_first_statement():
    head = BASE.replace("out.append(extract_shape(node))", "out.append(extract_shape(node) + 0)")
    assert _lines(head) == {ELIF_BODY}
    # a statement added to the branch: its block's first statement is a line the diff leaves equal
    appended = "out.append(extract_shape(node))\n"
    added = BASE.replace(appended, f"{appended}                out.sort()\n")
    assert _lines(added) == {ELIF_BODY}
    # an else added to the first if: the else line is part of that if, its body only a pass; both are
    # bounded by the block holding that if, the loop's body
    orelse = BASE.replace("continue\n", "continue\n            else:\n                pass\n")
    assert _lines(orelse) == {FIRST_IN_LOOP}


def test_a_change_the_anchors_cannot_bound_widens_to_the_enclosing_block_or_the_whole_function():
    # a line moved out of its block: the else keeps only a pass (bounded by BASE's first statement of that
    # else, found through the elif's unchanged line) and the moved line joins the loop's body
    moved_out = "                pass\n            out.append(node)\n"
    dedented = BASE.replace("                out.append(node * beta)\n", moved_out)
    assert _lines(dedented) == {ELSE_BODY, FIRST_IN_LOOP}
    # a statement put first in a block: BASE's first statement of the same block bounds it
    first = "                out.append(node)\n"
    assert _lines(BASE.replace(first, "                out.sort()\n" + first)) == {12}
    # an ``if True`` the compiler folds may run no code of its own, nor does ``continue`` surely report a
    # line: nothing in the loop anchors, and the loop sits in the function's body
    constant = BASE.replace("if node < 0:", "if True:")
    (changed,) = file_changes("m.py", constant, constant.replace("continue", "break"))
    assert changed.lines is None
    # straight in the function's body
    assert _lines(BASE.replace("out = []", "out = [0]")) is None
    assert _lines(BASE.replace("return out", "return out[::-1]")) is None
    # the def line itself, and a decorator
    assert _lines(BASE.replace("def call(self, nodes, beta):", "def call(self, nodes, beta=1):")) is None
    assert _lines(BASE.replace("    def call(", "    @staticmethod\n    def call(")) is None


def test_a_nested_def_s_defaults_change_the_function_that_runs_them():
    inner = "        def inner(y=1):\n            return y\n\n        return inner()\n"
    nested = BASE.replace("    def other(self, x):\n        return x\n", f"    def other(self, x):\n{inner}")
    assert "def inner" in nested
    changed = {c.name: c.lines for c in file_changes("m.py", nested, nested.replace("y=1", "y=2"))}
    assert changed == {"Decompose.other.inner": None, "Decompose.other": None}
    inside = {c.name: c.lines for c in file_changes("m.py", nested, nested.replace("return y\n", "return -y\n"))}
    assert inside == {"Decompose.other.inner": None}  # the inner body: the inner function only


def test_a_change_of_scoping_is_the_whole_function_though_it_sits_in_one_branch():
    # ``torch`` made local by a store no run reaches: every other read of it would fail
    local = BASE.replace("out.append(node * beta)", "torch = None\n                    out.append(node * beta)")
    local = local.replace("out = []", "out = [torch]")
    local_base = BASE.replace("out = []", "out = [torch]")
    found = {c.name: c for c in file_changes("m.py", local_base, local)}
    assert found[CALL].lines is None
    generator = BASE.replace("out.append(node * beta)", "yield node")
    assert _lines(generator) is None


def test_blank_and_comment_lines_inside_a_function_change_nothing():
    assert _lines(BASE.replace("        return out\n", "\n        # done\n        return out\n")) == frozenset()


def test_an_added_import_name_is_judged_by_the_lines_that_read_it():
    head = BASE.replace("import extract_shape", "import extract_shape, extract_dtype")
    head = head.replace("out.append(extract_shape(node))", "out.append(extract_shape(node, extract_dtype(node)))")
    assert file_changes("m.py", BASE, head) == {Change("m.py", FUNCTION, CALL)}
    assert _lines(head) == {ELIF_BODY}
    # anything else at module level stays a module-level change
    dropped = BASE.replace("import extract_shape", "import extract_dtype")
    fresh_module = BASE.replace("import torch\n", "import torch\nfrom m.other import helper\n")
    read_with_module = head + "DEFAULT = extract_dtype\n"
    for changed in (dropped, fresh_module, read_with_module):
        assert Change("m.py", MODULE) in file_changes("m.py", BASE, changed)


def _run(source: str, calls: list[tuple]) -> tuple[list, set[int]]:
    """Run ``Decompose.call`` on ``calls`` under a line tracer; its results and the lines it ran."""
    module = types.ModuleType("m_under_test")
    module.extract_shape = lambda node: ("shape", node)  # type: ignore[attr-defined]
    code = compile(source.replace("from m.mapping import extract_shape\n", ""), "<m>", "exec")
    ran: set[int] = set()

    def trace(frame, event, arg):
        if frame.f_code.co_filename == "<m>" and event == "line":
            ran.add(frame.f_lineno + 1)  # the import line removed above
        return trace

    exec(code, module.__dict__)
    sys.settrace(trace)
    try:
        results = [module.Decompose().call(*args) for args in calls]
    finally:
        sys.settrace(None)
    return results, ran


def test_a_run_that_never_ran_the_anchor_behaves_alike_on_both_sides():
    head = BASE.replace("out.append(extract_shape(node))", "out.append(extract_shape(-node))")
    (anchor,) = _lines(head)
    assert anchor in anchor_spans(BASE)
    for calls in ([([1, 2], 1)], [([1, -2], 2)], [([-1], 0)], [([3], 0)]):
        before, ran = _run(BASE, calls)
        after, _ = _run(head, calls)
        if anchor not in ran:
            assert before == after, calls
    # the one run that reaches the change is the one that ran the anchor
    reaching = [([3], 0)]
    assert _run(BASE, reaching)[0] != _run(head, reaching)[0] and anchor in _run(BASE, reaching)[1]
