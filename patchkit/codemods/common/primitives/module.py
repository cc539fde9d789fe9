"""Module level: find, replace and add top-level classes and functions by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import libcst as cst
from libcst._nodes.internal import visit_sequence

from patchkit.codemods.common.primitives.snippets import AnchorError, Statement, parse_statement


@dataclass(frozen=True)
class Verbatim(cst.BaseCompoundStatement):
    """A class, function or method no codemod of the file reads, kept as its
    source lines (``text``, each ending in a newline), after the blank lines
    and comments before it (``patchkit.transform.partial`` makes them)."""

    text: str
    leading_lines: Sequence[cst.EmptyLine] = ()

    def _visit_and_replace_children(self, visitor) -> "Verbatim":
        return Verbatim(self.text, visit_sequence(self, "leading_lines", self.leading_lines, visitor))

    def _codegen_impl(self, state) -> None:
        for line in self.leading_lines:
            line._codegen(state)
        state.add_token(self.text)


def is_definition(stmt: cst.CSTNode) -> bool:
    """A ``class`` or ``def``, parsed or kept verbatim."""
    return isinstance(stmt, (cst.FunctionDef, cst.ClassDef, Verbatim))


ClassEdit = Callable[[cst.ClassDef], cst.ClassDef]


FunctionEdit = Callable[[cst.FunctionDef], cst.FunctionDef]


def _find_named(
    statements: Sequence[Statement], kind: type[cst.FunctionDef | cst.ClassDef], name: str
) -> Optional[int]:
    """Index of the ``class``/``def`` called ``name`` among ``statements``."""
    for i, stmt in enumerate(statements):
        if isinstance(stmt, kind) and stmt.name.value == name:
            return i
    return None


def _replace_named(module: cst.Module, kind: type, name: str, edit, what: str) -> cst.Module:
    body = list(module.body)
    index = _find_named(body, kind, name)
    if index is None:
        raise AnchorError(f"{what} {name}")
    body[index] = edit(body[index])
    return module.with_changes(body=body)


def find_class(module: cst.Module, name: str) -> Optional[cst.ClassDef]:
    index = _find_named(module.body, cst.ClassDef, name)
    found = None if index is None else module.body[index]
    return found if isinstance(found, cst.ClassDef) else None


def replace_class(module: cst.Module, name: str, edit: ClassEdit) -> cst.Module:
    return _replace_named(module, cst.ClassDef, name, edit, "class")


def find_function(module: cst.Module, name: str) -> Optional[cst.FunctionDef]:
    """A top-level ``def name(...)``."""
    index = _find_named(module.body, cst.FunctionDef, name)
    found = None if index is None else module.body[index]
    return found if isinstance(found, cst.FunctionDef) else None


def replace_function(module: cst.Module, name: str, edit: FunctionEdit) -> cst.Module:
    return _replace_named(module, cst.FunctionDef, name, edit, "function")


def add_function(module: cst.Module, source: str, after: Optional[str] = None) -> cst.Module:
    """Add a top-level function (given as source) after function ``after``,
    else at the end, with the two blank lines PEP 8 puts around it."""
    new = parse_statement(source).with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)
    body = list(module.body)
    index = len(body)
    if after is not None:
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == after:
                index = i + 1
    if index < len(body) and len(body[index].leading_lines) < 2:
        following = body[index]
        body[index] = following.with_changes(
            leading_lines=[cst.EmptyLine(indent=False)] * (2 - len(following.leading_lines))
            + list(following.leading_lines)
        )
    body.insert(index, new)
    return module.with_changes(body=body)
