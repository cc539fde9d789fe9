"""Parsing code snippets into nodes, and the error a transform raises when its anchor is gone."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Union, cast

import libcst as cst
import libcst.matchers as m

# What a module or block body holds (libcst's only two kinds of BaseStatement,
# both with ``leading_lines``).
Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


class AnchorError(Exception):
    """An anchor a transform relies on is not there (detect should have said so)."""


def block_statements(suite: cst.BaseSuite) -> list[Statement]:
    """The statements of an indented block, as a list to edit. libcst types an
    ``IndentedBlock``'s body as BaseStatement, whose only kinds are these two."""
    return list(cast(Sequence[Statement], suite.body))


def parse_statements(source: str) -> list[Statement]:
    """Parse a (possibly indented) snippet into top-level statements."""
    return list(cst.parse_module(textwrap.dedent(source).strip("\n") + "\n").body)


def parse_statement(source: str) -> Statement:
    (stmt,) = parse_statements(source)
    return stmt


def parse_expression(source: str) -> cst.BaseExpression:
    return cst.parse_expression(textwrap.dedent(source).strip())


def parse_statements_with_comments(source: str) -> list[Statement]:
    """Like ``parse_statements``, but comment lines above the first statement
    stay with it (``parse_statements`` leaves them in the module header)."""
    module = cst.parse_module(textwrap.dedent(source).strip("\n") + "\n")
    body = list(module.body)
    comments = [line for line in module.header if line.comment is not None]
    if body and comments:
        body[0] = body[0].with_changes(leading_lines=[*comments, *body[0].leading_lines])
    return body


def _docstring_count(body: Sequence[Statement]) -> int:
    """1 where ``body`` opens with a docstring (new statements go below it), else 0."""
    docstring = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
    return 1 if body and m.matches(body[0], docstring) else 0
