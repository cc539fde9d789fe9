"""Inside a function body: insert statements (at the start, at the end, before an anchor),
replace matching statements, and wrap statements in ``if``/``else``."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Optional, Union, overload

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common.primitives.expressions import replace_node
from patchkit.codemods.common.primitives.search import _N, find_all, paths_to, visit_below
from patchkit.codemods.common.primitives.snippets import (
    AnchorError,
    Statement,
    _docstring_count,
    block_statements,
    parse_expression,
    parse_statement,
    parse_statements,
    parse_statements_with_comments,
)


def insert_at_start(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """Insert statements at the start of a function body, after its docstring."""
    body = block_statements(fn.body)
    index = _docstring_count(body)
    body[index:index] = parse_statements(source)
    return fn.with_changes(body=fn.body.with_changes(body=body))


StatementResult = Union[cst.BaseStatement, cst.FlattenSentinel, cst.RemovalSentinel]
StatementEdit = Callable[[Statement], StatementResult]


class _StatementReplacer(cst.CSTTransformer):
    def __init__(self, matcher: m.BaseMatcherNode, edit: Callable[..., StatementResult], visit: set[int]) -> None:
        super().__init__()
        self.matcher = matcher
        self.edit = edit
        self.count = 0
        self.visit = visit  # only subtrees holding a match (see search.paths_to)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.visit

    def leave_SimpleStatementLine(self, original, updated):
        if m.matches(original, self.matcher):
            self.count += 1
            return self.edit(updated)
        return updated

    def leave_If(self, original, updated):
        if m.matches(original, self.matcher):
            self.count += 1
            return self.edit(updated)
        return updated


# The edit is handed what the matcher matched: an ``if`` for an m.If, a line for an m.SimpleStatementLine.
@overload
def replace_statements(node: _N, matcher: m.If, edit: Callable[[cst.If], StatementResult]) -> _N: ...
@overload
def replace_statements(
    node: _N, matcher: m.SimpleStatementLine, edit: Callable[[cst.SimpleStatementLine], StatementResult]
) -> _N: ...
@overload
def replace_statements(node: _N, matcher: m.BaseMatcherNode, edit: StatementEdit) -> _N: ...
def replace_statements(node: _N, matcher: m.BaseMatcherNode, edit: Callable[..., StatementResult]) -> _N:
    """Replace every simple statement line (or ``if``) under ``node`` that matches."""
    replacer = _StatementReplacer(matcher, edit, paths_to(node, find_all(node, matcher)))
    result = visit_below(node, replacer)
    if replacer.count == 0:
        raise AnchorError(f"no statement matching {matcher!r}")
    return result


def guard_statement(stmt: Statement, condition: str) -> cst.If:
    """Wrap a statement in ``if <condition>:``, keeping its leading comments
    above the ``if``."""
    inner = stmt.with_changes(leading_lines=[])
    return cst.If(
        test=parse_expression(condition),
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=stmt.leading_lines,
    )


def guard_statements(stmts: Sequence[Statement], condition: str, comment: str = "") -> cst.If:
    """Wrap consecutive statements in one ``if <condition>:``; the first
    statement's leading comments/blank lines stay above the ``if``. With a
    ``comment`` (lines, without ``# ``), only its leading blank lines go above,
    then the comment, and the statement keeps its own comments inside."""
    if not stmts:
        raise AnchorError("guard_statements needs at least one statement")
    lead = list(stmts[0].leading_lines)
    blanks = len(lead) if not comment else next((i for i, line in enumerate(lead) if line.comment), len(lead))
    inner = [stmts[0].with_changes(leading_lines=lead[blanks:])] + list(stmts[1:])
    ours = [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in comment.splitlines()]
    return cst.If(
        test=parse_expression(condition),
        body=cst.IndentedBlock(body=inner),
        leading_lines=[*lead[:blanks], *ours],
    )


def branch_statements(stmts: Sequence[Statement], condition: str, then_source: str) -> cst.If:
    """``if <condition>: <then_source> else: <stmts>``: new code for one case,
    the existing statements unchanged for the others. Leading comments of the
    first statement stay above the ``if``."""
    if not stmts:
        raise AnchorError("branch_statements needs at least one statement")
    inner = [stmts[0].with_changes(leading_lines=[])] + list(stmts[1:])
    # Parsed as a block (not a module) so its leading comments stay in it.
    then = cst.ensure_type(
        parse_statement("if _:\n" + textwrap.indent(textwrap.dedent(then_source).strip("\n"), "    ") + "\n"), cst.If
    )
    return cst.If(
        test=parse_expression(condition),
        body=then.body,
        orelse=cst.Else(body=cst.IndentedBlock(body=inner)),
        leading_lines=stmts[0].leading_lines,
    )


def insert_at_end(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """Append statements (leading comments kept) at the end of a function body
    (after its last statement; a trailing comment block stays last)."""
    body = block_statements(fn.body)
    body.extend(parse_statements_with_comments(source))
    return fn.with_changes(body=fn.body.with_changes(body=body))


def find_statement_index(fn: cst.FunctionDef, matcher: m.BaseMatcherNode) -> Optional[int]:
    """Index of the first top-level statement of ``fn``'s body that matches, or
    that contains a node matching ``matcher`` (e.g. the line of a call)."""
    for i, stmt in enumerate(fn.body.body):
        if find_all(stmt, matcher):
            return i
    return None


def insert_before(fn: cst.FunctionDef, matcher: m.BaseMatcherNode, source: str) -> cst.FunctionDef:
    """Insert statements (leading comments kept) just above the first top-level
    statement of ``fn`` that matches (or contains a match of) ``matcher``. The anchor's blank lines
    go above the new code and one blank line separates the new code from the
    anchor; the anchor's own comments stay attached to it."""
    index = find_statement_index(fn, matcher)
    if index is None:
        raise AnchorError(f"{fn.name.value}: no statement matching {matcher!r}")
    body = block_statements(fn.body)
    anchor = body[index]
    lines = list(anchor.leading_lines)
    first_comment = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
    new = parse_statements_with_comments(source)
    new[0] = new[0].with_changes(leading_lines=[*lines[:first_comment], *new[0].leading_lines])
    body[index] = anchor.with_changes(leading_lines=[cst.EmptyLine(indent=False)] + lines[first_comment:])
    body[index:index] = new
    return fn.with_changes(body=fn.body.with_changes(body=body))


def replace_block_statements(
    node: _N, block: cst.IndentedBlock, start: int, end: int, edit: Callable[[list[Statement]], Statement]
) -> _N:
    """``node`` with statements ``start:end`` of ``block`` (a block somewhere
    under ``node``: a method body, or the block a fork moved them into)
    replaced by ``edit(statements)``, e.g. :func:`guard_statements`."""
    body = block_statements(block)
    body[start:end] = [edit(body[start:end])]
    edited = block.with_changes(body=body)
    return replace_node(node, block, edited)
