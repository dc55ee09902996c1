"""Narrowing a changed function to the blocks a run must enter to reach the change.

A function every item calls (a pass's ``call``, ``QuantLinear.forward``) selects every item at function
granularity, yet a change inside one branch of it reaches only the runs that enter that branch. A block
(the body of an ``if``, its ``else``, a loop's body, a ``with``'s, a ``try``'s or a handler's) is entered
through its first statement, so that statement is the change's *anchor*: a run that never ran any anchor in
BASE runs BASE's and the head's code alike to the end (the first line where they could part is a changed
one, and reaching it needs its anchor, a statement they share, to have run first). The anchor is looked for
on both sides: for a removed line, the first statement of its block in BASE; for an added line, the first
statement of the same block in BASE, found through the block's parent statement, whose first line the diff
must leave equal. Where a block's first statement is not one whose run is sure to be recorded (a ``def``,
``global``, ``pass``, a bare constant, a folded ``while True``), or no such parent is found, the enclosing
block is tried instead; a change in the function's own body is no narrowing at all (None: the whole
function).
So is a change the anchors cannot bound:
- a line of the ``def`` itself (decorators, signature, defaults), and for a function defined inside another,
  that other function too, which runs those lines;
- a change of the function's scoping facts: a name made local, global or free, a ``yield`` added or
  removed, which alters lines the diff did not touch;
- a qualified name defined twice in the file (which body a line belongs to is ambiguous).
A run of an anchor is recorded as a run of any line of its header (a statement's lines; a compound
statement's lines before its body), since Python reports a multi-line statement under any of its lines
(``anchor_spans``). An import statement that only adds names to a ``from m import ...`` that BASE already
had at module level binds those names and nothing else; the lines that read them are then the change
(``added_import_reads``). Selection narrows by anchors only where the map's tico file is BASE's, byte for
byte (harness/tico_facts/change_selection.py), since anchors are BASE line numbers.
"""

from __future__ import annotations

import ast
import symtable

# Statements whose run always reports a line of their header: an anchor is one of these.
_RECORDED = (
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Raise, ast.Delete,
    ast.Import, ast.ImportFrom, ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith,
)  # fmt: skip
_BLOCK_FIELDS = ("body", "orelse", "finalbody")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_ANONYMOUS = ("lambda", "listcomp", "setcomp", "dictcomp", "genexpr")


class _Side:
    """One side's parse: every function by qualified name, and each statement's parent."""

    def __init__(self, source: str):
        self.source = source
        self.tree = ast.parse(source)
        self.lines = source.splitlines()
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.enclosing: dict[str, str] = {}  # a function defined inside another: that function
        self.parent: dict[ast.AST, ast.AST] = {}
        self._index(self.tree, "", None)

    def _index(self, node: ast.AST, prefix: str, outer: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                self.functions.setdefault(name, []).append(child)
                if outer is not None:
                    self.enclosing[name] = outer
                self._index(child, f"{name}.", name)
            elif isinstance(child, ast.ClassDef):
                self._index(child, f"{prefix}{child.name}.", outer)
            else:
                self._index(child, prefix, outer)

    def innermost_statement(self, function: ast.AST, line: int) -> ast.stmt | None:
        """The innermost statement of ``function``'s body (its own nested functions excluded) that spans
        ``line``; None where only the function itself does."""
        found: ast.stmt | None = None
        frontier = list(function.body)  # type: ignore[attr-defined]
        while frontier:
            node = frontier.pop()
            if isinstance(node, ast.stmt) and _spans(node, line):
                found = node
                frontier = [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler))]
                frontier += [s for c in ast.iter_child_nodes(node) if isinstance(c, ast.match_case) for s in c.body]
            elif isinstance(node, ast.excepthandler) and _spans(node, line):
                frontier = list(node.body)
        return found


def _scoping(source: str) -> dict[str, list[dict[str, tuple[bool, ...]]]]:
    """Per qualified function name, for each definition of it: how each name is bound there."""
    facts: dict[str, list[dict[str, tuple[bool, ...]]]] = {}

    def visit(table: symtable.SymbolTable, prefix: str) -> None:
        for child in table.get_children():
            name = f"{prefix}{child.get_name()}"
            if child.get_type() == "function" and child.get_name() not in _ANONYMOUS:
                facts.setdefault(name, []).append({s.get_name(): _binding(s) for s in child.get_symbols()})
            visit(child, f"{name}.")

    visit(symtable.symtable(source, "<tico>", "exec"), "")
    return facts


def _first_run(block: list[ast.stmt]) -> ast.stmt | None:
    """The statement that runs first whenever ``block`` is entered and whose run is recorded; None where
    that is not sure (then the enclosing block anchors)."""
    for statement in block:
        if isinstance(statement, ast.Pass) or _constant(statement):
            continue  # nothing runs there
        if isinstance(statement, ast.Try):
            return _first_run(statement.body)
        if not isinstance(statement, _RECORDED) or _folded(statement):
            return None
        if isinstance(statement, ast.AnnAssign) and statement.value is None:
            return None
        return statement
    return None


def _constant(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _folded(statement: ast.stmt) -> bool:
    """An ``if``/``while`` the compiler may fold (``while True``, ``if __debug__``): its header may run no
    code of its own."""
    test = getattr(statement, "test", None)
    return isinstance(test, ast.Constant) or (isinstance(test, ast.Name) and test.id == "__debug__")


def _header_lines(statement: ast.stmt) -> range:
    """The lines a run of ``statement`` reports one of: a compound statement's before its body."""
    body = getattr(statement, "body", None)
    last = body[0].lineno - 1 if isinstance(body, list) and body else statement.end_lineno or statement.lineno
    return range(statement.lineno, max(statement.lineno, last) + 1)


def _block_of(parent: ast.AST, statement: ast.AST) -> tuple[str, list[ast.stmt]] | None:
    """Which block of ``parent`` holds ``statement``: its field and its statements."""
    for field in _BLOCK_FIELDS:
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(s is statement for s in block):
            return field, block
    return None


def _binding(symbol: symtable.Symbol) -> tuple[bool, ...]:
    return symbol.is_local(), symbol.is_global(), symbol.is_declared_global(), symbol.is_nonlocal(), symbol.is_free()


def _yields(function: ast.AST) -> bool:
    frontier = list(ast.iter_child_nodes(function))
    while frontier:
        node = frontier.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, _SCOPES):
            frontier.extend(ast.iter_child_nodes(node))
    return False


def _same_scoping(name: str, base: _Side, head: _Side, facts: tuple[dict, dict]) -> bool:
    before, after = facts[0].get(name, []), facts[1].get(name, [])
    if len(before) != 1 or len(after) != 1:
        return False
    if any(before[0][symbol] != after[0][symbol] for symbol in before[0].keys() & after[0].keys()):
        return False
    return _yields(base.functions[name][0]) == _yields(head.functions[name][0])


class _Anchors:
    """The anchors of one file's change, per function qualified name (None: the whole function)."""

    def __init__(self, base: str, head: str, equal: dict[int, int]):
        self.base, self.head = _Side(base), _Side(head)
        self.equal = equal
        self.found: dict[str, set[int] | None] = {}
        self.base_nodes: dict[int, list[ast.AST]] = {}
        for node in ast.walk(self.base.tree):
            if isinstance(node, (ast.stmt, ast.excepthandler)):
                self.base_nodes.setdefault(node.lineno, []).append(node)

    def add(self, side: _Side, name: str, line: int) -> None:
        """Record the anchor of ``line`` (a line of ``side`` in function ``name``)."""
        defined, outer = side.functions.get(name, []), side.enclosing.get(name)
        if outer is not None and (len(defined) != 1 or line < defined[0].body[0].lineno):
            self.found[outer] = None  # a nested def's decorators and defaults run in the function around it
        if name in self.found and self.found[name] is None:
            return
        anchor = self._anchor(side, name, line)
        if anchor == 0:  # a blank or comment line between statements: nothing runs there
            return
        if anchor is None:
            self.found[name] = None
        else:
            self.found.setdefault(name, set()).add(anchor)  # type: ignore[union-attr]

    def _anchor(self, side: _Side, name: str, line: int) -> int | None:
        defined = side.functions.get(name, [])
        if len(defined) != 1:
            return None
        function = defined[0]
        if line < function.body[0].lineno:  # decorators, signature, defaults
            return None
        statement: ast.AST | None = side.innermost_statement(function, line)
        if statement is None:
            return 0 if not is_code(side.lines, line) else None
        while statement is not None and statement is not function:
            parent = side.parent.get(statement)
            held = _block_of(parent, statement) if parent is not None and parent is not function else None
            if held is None:
                return None
            field, block = held
            if side is not self.base:  # the same block in BASE, through its parent's unchanged first line
                twin = self._base_twin(parent)  # type: ignore[arg-type]
                block = getattr(twin, field, None) or [] if twin is not None else []
            first = _first_run(block)
            if first is not None:
                return first.lineno
            statement = parent if isinstance(parent, ast.stmt) else side.parent.get(parent)  # type: ignore[arg-type]
        return None

    def _base_twin(self, node: ast.AST) -> ast.AST | None:
        """BASE's node of ``node``'s kind starting on the line the diff maps ``node``'s first line to."""
        line = self.equal.get(getattr(node, "lineno", -1))
        found = [n for n in self.base_nodes.get(line, []) if type(n) is type(node)]  # type: ignore[arg-type]
        return found[0] if len(found) == 1 else None

    def result(self) -> dict[str, frozenset[int] | None]:
        facts = (_scoping(self.base.source), _scoping(self.head.source))
        return {
            name: None if lines is None or not _same_scoping(name, self.base, self.head, facts) else frozenset(lines)
            for name, lines in self.found.items()
        }


def anchors(
    base: str, head: str, equal: dict[int, int], base_lines: dict[int, str], head_lines: dict[int, str]
) -> dict[str, frozenset[int] | None]:
    """Per function the lines touch (``base_lines``: BASE line -> its function's qualified name;
    ``head_lines`` the same for the head), the BASE anchors that bound them; None for a function
    they cannot narrow. ``equal``: each head line the diff leaves equal, with its BASE line. A file
    either side cannot parse narrows nothing."""
    try:
        found = _Anchors(base, head, equal)
    except SyntaxError:
        return {name: None for name in {*base_lines.values(), *head_lines.values()}}
    for side, lines in ((found.base, base_lines), (found.head, head_lines)):
        for line, name in sorted(lines.items()):
            found.add(side, name, line)
    return found.result()


def added_import_reads(
    base: str, head: str, module_lines: tuple[set[int], set[int]]
) -> tuple[set[int], set[int]] | None:
    """Where the module-level lines a change touches (BASE's, the head's) are all ``from m import ...``
    statements that only add names, from modules BASE already imported so at module level: the lines
    of function bodies that read an added name, in BASE and in the head. None where the module-level
    change is anything else, or an added name is bound again or read outside every function body (the
    module-level rule applies then)."""
    try:
        sides = ast.parse(base), ast.parse(head)
    except SyntaxError:
        return None
    bound: list[dict[str, tuple]] = []
    for tree, lines in zip(sides, module_lines):
        statements = [s for s in tree.body if any(_spans(s, line) for line in lines)]
        placed = all(_statement_at(tree, line) is not None for line in lines)
        if not placed or not all(isinstance(s, ast.ImportFrom) for s in statements):
            return None  # a line of something else (a class decorator, a constant), or of no statement found
        bound.append({(a.asname or a.name): (s.module, s.level, a.name) for s in statements for a in s.names})  # type: ignore[union-attr]
    before, after = bound
    if any(before.get(name) != after.get(name) for name in before):  # a name dropped or rebound
        return None
    added = after.keys() - before.keys()
    imported = {(s.module, s.level) for s in sides[0].body if isinstance(s, ast.ImportFrom)}
    if not {(module, level) for module, level, _ in after.values()} <= imported:
        return None  # a module BASE did not import: importing it runs its body
    reads: list[set[int]] = []
    for tree, lines in zip(sides, module_lines):
        inside: set[int] = set()
        for statement in tree.body:
            if any(_spans(statement, line) for line in lines):
                continue  # the imports themselves
            bodies = [n for n in ast.walk(statement) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            in_bodies = {id(n) for f in bodies for part in f.body for n in ast.walk(part)}
            for node in ast.walk(statement):
                if _binds(node, added):
                    return None
                if isinstance(node, ast.Name) and node.id in added:
                    if id(node) not in in_bodies:
                        return None  # read with the module: a default, a decorator, a class body
                    inside.add(node.lineno)
        reads.append(inside)
    return reads[0], reads[1]


def _spans(statement: ast.stmt | ast.excepthandler, line: int) -> bool:
    """Whether ``line`` lies in the statement, its decorators included (a decorated class or function
    starts at its first decorator, not at its ``class`` or ``def`` line)."""
    first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))])
    return first <= line <= (statement.end_lineno or statement.lineno)


def _statement_at(tree: ast.Module, line: int) -> ast.stmt | None:
    return next((s for s in tree.body if _spans(s, line)), None)


def is_code(lines: list[str], line: int) -> bool:
    """Whether 1-based ``line`` of ``lines`` holds code (not blank, not only a comment)."""
    stripped = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return bool(stripped) and not stripped.startswith("#")


def _binds(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` binds one of ``names`` (at any scope: a binding in a function may be global)."""
    if isinstance(node, ast.Name):
        return node.id in names and isinstance(node.ctx, (ast.Store, ast.Del))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name in names
    if isinstance(node, ast.alias):
        return (node.asname or node.name).split(".")[0] in names
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return bool(set(node.names) & names)
    return False


def anchor_spans(source: str) -> dict[int, range]:
    """Every statement of ``source`` that can anchor a change (the first recorded statement of a block),
    by its first line, with the lines whose run counts as its run: what a per-item map records."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[int, range] = {}
    for node in ast.walk(tree):
        for field in _BLOCK_FIELDS:
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                first = _first_run(block)
                if first is not None:
                    found[first.lineno] = _header_lines(first)
    return found
