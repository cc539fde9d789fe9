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


def remove_statements(node: _N, matcher: m.BaseMatcherNode) -> _N:
    """Remove every simple statement line (or ``if``) under ``node`` that matches."""
    return replace_statements(node, matcher, lambda _statement: cst.RemovalSentinel.REMOVE)


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


def insert_above_holder(
    block: cst.IndentedBlock, node: cst.CSTNode, source: str, replacement: Optional[cst.CSTNode] = None
) -> cst.IndentedBlock:
    """``block`` with the statements of ``source`` (leading comments kept) just above
    its statement that holds ``node`` (that very node), and ``node`` replaced by
    ``replacement`` when given: new code computing what an edited call is handed."""
    body = block_statements(block)
    index = next((i for i, stmt in enumerate(body) if find_all(stmt, m.MatchIfTrue(lambda n: n is node))), None)
    if index is None:
        raise AnchorError("the block holds no statement with that node")
    if replacement is not None:
        body[index] = replace_node(body[index], node, replacement)
    body[index:index] = parse_statements_with_comments(source)
    return block.with_changes(body=body)


def append_parameters(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """``fn`` with the parameters of ``source`` (``"a: int = 0, b=None"``) after its
    last plain parameter, in its own layout (one a line with a trailing comma
    stays so). ``fn`` must have plain parameters and no ``*`` / ``**`` ones."""
    params = list(fn.params.params)
    new = list(cst.ensure_type(parse_statement(f"def f({source}): pass"), cst.FunctionDef).params.params)
    if not has_plain_parameters(fn):
        raise AnchorError(f"{fn.name.value}: parameters other than plain ones")
    last = params[-1]
    between = params[-2].comma if len(params) >= 2 and isinstance(params[-2].comma, cst.Comma) else None
    between = between or cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    params[-1] = last.with_changes(comma=between, whitespace_after_param=cst.SimpleWhitespace(""))
    params += [p.with_changes(comma=between) for p in new[:-1]]
    params.append(new[-1].with_changes(comma=last.comma, whitespace_after_param=last.whitespace_after_param))
    return fn.with_changes(params=fn.params.with_changes(params=params))


def has_plain_parameters(fn: cst.FunctionDef) -> bool:
    """Whether ``fn`` takes plain parameters only (at least one; no ``*``, ``**`` or
    keyword-only ones): what :func:`append_parameters` can extend."""
    p = fn.params
    return bool(p.params) and not p.kwonly_params and p.star_kwarg is None and not isinstance(p.star_arg, cst.Param)
