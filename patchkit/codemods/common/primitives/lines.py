"""Where a node is: ``line_of``, the line a finding points at, without
libcst's PositionProvider (which would resolve every node of the module)."""

from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache
from typing import Any, Optional

import libcst as cst

_NO_CONTEXT = nullcontext()


@lru_cache(maxsize=256)
def line_of(module: cst.Module, node: cst.CSTNode) -> Optional[int]:
    """1-based line where ``node`` (a node of ``module``) starts, as
    libcst's PositionProvider gives it (whitespace and comments before it
    excluded). Found by generating code and counting newlines, one top-level
    statement (or method, inside a class) at a time, each generated once and
    remembered by identity: a transformed module shares its unchanged
    statements with the module it came from. Resolving every node's position
    (PositionProvider) made three fifths of a cold apply (a finding's "first
    at LINE"); generating the module up to the node for each call, a tenth."""
    if node is module:
        return 1  # a Module starts where its code does: line 1
    known = _from_a_known_start(module, node)
    if known is not None:
        return known
    line = 1
    for item in (*module.header, *module.body, *module.footer):
        lines = _lines(item, module.default_indent, module.default_newline)
        found = _line_in(lines, node, line)
        if found is not None:
            return found
        line += lines[1]
    return None


# Where definitions of a module start, as its parser knew (``remember_starts``):
# id(module) -> (module, [(definition, its `def`/`class` line, a class?)]).
_STARTS: dict[int, tuple] = {}
_IDS: dict[int, tuple] = {}  # id(definition) -> (definition, the ids of the nodes in it)


def remember_starts(module: cst.Module, starts: list[tuple[cst.CSTNode, int, bool]]) -> None:
    """Where the functions, methods and classes of ``module`` (as it is, not
    a module made from it) start: ``(definition, line of its def or class
    keyword, whether a class)``, methods before their classes. A node in one
    of them is then found at the line its definition starts plus its place
    in it, without generating the code before (``patchkit.transform.partial``
    knows them from its ``ast``)."""
    if len(_STARTS) > 64:
        _STARTS.clear()
    _STARTS[id(module)] = (module, starts, {id(unit): (unit, start) for unit, start, _ in starts})


def _from_a_known_start(module: cst.Module, node: cst.CSTNode) -> Optional[int]:
    hit = _STARTS.get(id(module))
    if hit is None or hit[0] is not module:
        return None
    from patchkit.codemods.common.primitives.search import _index

    itself = hit[2].get(id(node))
    if itself is not None and itself[0] is node:
        return itself[1]
    for unit, start, is_class in hit[1]:
        if is_class:
            continue  # inside a class but no method: generating the class is the way
        ids = _IDS.get(id(unit))
        if ids is None or ids[0] is not unit:
            if len(_IDS) > 4096:
                _IDS.clear()
            ids = _IDS[id(unit)] = (unit, {id(n) for n in _index(unit)[0]})
        if id(node) in ids[1]:
            lines = _lines(unit, module.default_indent, module.default_newline)
            own, at = _line_in(lines, unit, 0), _line_in(lines, node, 0)
            return None if own is None or at is None else start - own + at
    return None


# id(statement) -> _lines of it: (statement, newlines, {id(node): line of its
# syntactic part, from the statement's start}, {id(node): node its position
# starts at}, [(_lines of a body statement, line from its start)], indent,
# newline, {id(node): line where its code starts}). The entry holds the
# statement, so ids stay valid.
_LINES: dict[int, tuple] = {}


def _line_in(lines: tuple, node: cst.CSTNode, base: int) -> Optional[int]:
    found = lines[2].get(id(node))
    if found is not None:
        return base + found
    start = lines[3].get(id(node))
    if start is not None:  # IndentedBlock: where its first statement starts
        return _line_in(lines, start, base)
    found = lines[7].get(id(node))
    if found is not None:  # no syntactic part: where its code starts
        return base + found
    for child, offset in lines[4]:
        found = _line_in(child, node, base + offset)
        if found is not None:
            return found
    return None


def _lines(item: cst.CSTNode, indent: str, newline: str) -> tuple:
    """Where each node of ``item`` starts, relative to ``item``'s own
    start, from one generation of its code (a class: of its own lines, with
    each statement of its body generated on its own, as a child)."""
    hit = _LINES.get(id(item))
    if hit is not None and hit[0] is item and hit[5] == indent and hit[6] == newline:
        return hit
    from libcst._nodes.internal import CodegenState

    children: list[tuple[tuple, int]] = []
    alias: dict[int, cst.CSTNode] = {}
    generated = item
    stand_ins: list[_Newlines] = []
    body = getattr(item, "body", None)
    if isinstance(item, cst.ClassDef) and isinstance(body, cst.IndentedBlock) and body.body:
        # The class with each body statement standing in for its lines.
        stand_ins = [_Newlines(_lines(stmt, indent, newline)) for stmt in body.body]
        new_body = body.with_changes(body=stand_ins)
        generated = item.with_changes(body=new_body)
        alias = {id(generated): item, id(new_body): body}

    starts: dict[int, int] = {}
    found: dict[int, int] = {}
    redirect: dict[int, cst.CSTNode] = {}

    class Record(CodegenState):
        line = 0
        stood_in = children

        def add_token(self, value: str) -> None:
            self.line += value.count("\n")

        def add_indent_tokens(self) -> None:  # indentation holds no newline
            pass

        # A node without a syntactic part (whitespace) starts where its code
        # does; the first time a node is generated counts (after_codegen is
        # not needed: a node records its syntactic position every time or never).
        def before_codegen(self, current) -> None:
            starts.setdefault(id(current), self.line)

        def record_syntactic_position(self, current, *, start_node=None, end_node=None):
            key = id(current)
            if key not in found and key not in redirect:
                if start_node is None:
                    found[key] = self.line
                else:  # the position starts where that child does
                    redirect[key] = start_node.lines[0] if type(start_node) is _Newlines else start_node
            return _NO_CONTEXT  # called for every node: no generator-based context manager

    state = Record(default_indent=indent, default_newline=newline)
    generated._codegen(state)
    if generated is not item:  # what stood in for the class: its ids are the class's
        for stand_in in stand_ins:  # what generated's body holds
            starts.pop(id(stand_in), None)
        tables: tuple[dict[int, Any], ...] = (starts, found, redirect)
        for table in tables:
            for key, value in alias.items():
                if key in table:
                    table[id(value)] = table.pop(key)
    lines = (item, state.line, found, redirect, children, indent, newline, starts)
    if len(_LINES) > 2048:
        _LINES.clear()
    _LINES[id(item)] = lines
    return lines


class _Newlines(cst.CSTNode):
    """Stands in for a statement of a class body whose lines are known: its
    code is that many newlines (``_lines`` generates the class around it)."""

    __slots__ = ("lines",)  # type: ignore[misc]  # typeshed declares ABC.__slots__ as an instance variable
    lines: tuple

    def __init__(self, lines: tuple) -> None:
        object.__setattr__(self, "lines", lines)  # the statement's _lines

    def _visit_and_replace_children(self, visitor):  # never visited
        return self

    def _codegen_impl(self, state) -> None:
        state.stood_in.append((self.lines, state.line))
        state.line += self.lines[1]
