"""Reusable edit primitives: the only place patchkit navigates or edits a CST.

They navigate by name (module -> class -> method -> statement) instead of
visiting the whole module, because a full libcst visit of a 3k-line file costs
about as much as parsing it, and a patch touches a handful of nodes. Inside a
method, where code is small, they use libcst matchers.

Every per-patch codemod is written with these; none re-implements them.
"""

from __future__ import annotations

import textwrap
from typing import Callable, Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

Statement = cst.BaseStatement
ClassEdit = Callable[[cst.ClassDef], cst.ClassDef]
FunctionEdit = Callable[[cst.FunctionDef], cst.FunctionDef]


class AnchorError(Exception):
    """An anchor a transform relies on is not there (detect should have said so)."""


# --- parsing snippets -------------------------------------------------------


def parse_statements(source: str) -> list[Statement]:
    """Parse a (possibly indented) snippet into top-level statements."""
    return list(cst.parse_module(textwrap.dedent(source).strip("\n") + "\n").body)


def parse_statement(source: str) -> Statement:
    (stmt,) = parse_statements(source)
    return stmt


def parse_expression(source: str) -> cst.BaseExpression:
    return cst.parse_expression(textwrap.dedent(source).strip())


# --- classes ----------------------------------------------------------------


def find_class(module: cst.Module, name: str) -> Optional[cst.ClassDef]:
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            return stmt
    return None


def replace_class(module: cst.Module, name: str, edit: ClassEdit) -> cst.Module:
    body = list(module.body)
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            body[i] = edit(stmt)
            return module.with_changes(body=body)
    raise AnchorError(f"class {name}")


def class_body(cls: cst.ClassDef) -> Sequence[Statement]:
    body = cls.body
    return body.body if isinstance(body, cst.IndentedBlock) else ()


def _with_class_body(cls: cst.ClassDef, statements: Sequence[Statement]) -> cst.ClassDef:
    return cls.with_changes(body=cls.body.with_changes(body=list(statements)))


def base_names(cls: cst.ClassDef) -> list[str]:
    """Names of the bases as written (``Base`` or ``mod.Base`` -> ``Base``)."""
    names = []
    for arg in cls.bases:
        value = arg.value
        if m.matches(value, m.Attribute()):
            names.append(value.attr.value)
        elif m.matches(value, m.Name()):
            names.append(value.value)
    return names


# --- methods ----------------------------------------------------------------


def methods(cls: cst.ClassDef) -> Iterator[cst.FunctionDef]:
    for stmt in class_body(cls):
        if isinstance(stmt, cst.FunctionDef):
            yield stmt


def find_method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    return next((f for f in methods(cls) if f.name.value == name), None)


def find_first_method(cls: cst.ClassDef, names: Sequence[str]) -> Optional[cst.FunctionDef]:
    """The first of several alternative names (a method renamed across releases)."""
    for name in names:
        found = find_method(cls, name)
        if found is not None:
            return found
    return None


def replace_method(cls: cst.ClassDef, name: str, edit: FunctionEdit) -> cst.ClassDef:
    body = list(class_body(cls))
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            body[i] = edit(stmt)
            return _with_class_body(cls, body)
    raise AnchorError(f"{cls.name.value}.{name}")


def add_method(cls: cst.ClassDef, source: str, after: Optional[str] = None) -> cst.ClassDef:
    """Add a method (given as source) after method ``after``, else at the end."""
    new = parse_statement(source)
    new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    body = list(class_body(cls))
    index = len(body)
    if after is not None:
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == after:
                index = i + 1
    body.insert(index, new)
    return _with_class_body(cls, body)


# --- class attributes -------------------------------------------------------


def _assigned_name(stmt: Statement) -> Optional[str]:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        return small.targets[0].target.value
    if m.matches(small, m.AnnAssign(target=m.Name())):
        return small.target.value
    return None


def find_class_attribute(cls: cst.ClassDef, name: str) -> Optional[cst.BaseSmallStatement]:
    """``name = ...`` or ``name: T = ...`` directly in the class body."""
    for stmt in class_body(cls):
        if _assigned_name(stmt) == name:
            return stmt.body[0]
    return None


def _docstring_count(body: Sequence[Statement]) -> int:
    docstring = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
    return 1 if body and m.matches(body[0], docstring) else 0


def add_class_attribute(cls: cst.ClassDef, source: str) -> cst.ClassDef:
    """Add ``source`` (e.g. ``flag: bool = False``) at the top of the class body,
    after the docstring, so it reads as part of the class's declaration."""
    body = list(class_body(cls))
    index = _docstring_count(body)
    body.insert(index, parse_statement(source))
    return _with_class_body(cls, body)


# --- inside a function ------------------------------------------------------


def insert_at_start(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """Insert statements at the start of a function body, after its docstring."""
    body = list(fn.body.body)
    index = _docstring_count(body)
    body[index:index] = parse_statements(source)
    return fn.with_changes(body=fn.body.with_changes(body=body))


def contains(node: cst.CSTNode, matcher: m.BaseMatcherNode) -> bool:
    return bool(m.findall(node, matcher))


StatementEdit = Callable[[cst.BaseStatement], Union[cst.BaseStatement, cst.FlattenSentinel, cst.RemovalSentinel]]


class _StatementReplacer(cst.CSTTransformer):
    def __init__(self, matcher: m.BaseMatcherNode, edit: StatementEdit) -> None:
        super().__init__()
        self.matcher = matcher
        self.edit = edit
        self.count = 0

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


def replace_statements(node: cst.CSTNode, matcher: m.BaseMatcherNode, edit: StatementEdit) -> cst.CSTNode:
    """Replace every simple statement line (or ``if``) under ``node`` that matches."""
    replacer = _StatementReplacer(matcher, edit)
    result = node.visit(replacer)
    if replacer.count == 0:
        raise AnchorError(f"no statement matching {matcher!r}")
    return result


def guard_statement(stmt: cst.BaseStatement, condition: str) -> cst.If:
    """Wrap a statement in ``if <condition>:``, keeping its leading comments
    above the ``if``."""
    inner = stmt.with_changes(leading_lines=[])
    return cst.If(
        test=parse_expression(condition),
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=stmt.leading_lines,
    )


def replace_expressions(node: cst.CSTNode, matcher: m.BaseMatcherNode, replacement) -> cst.CSTNode:
    """libcst's own matcher replace, re-exported so codemods use one spelling."""
    return m.replace(node, matcher, replacement)


# --- imports ----------------------------------------------------------------


def add_needed_imports(module: cst.Module, context: CodemodContext) -> cst.Module:
    """Run libcst's AddImportsVisitor on the module's import header only.

    Visiting a whole 3k-line module costs as much as parsing it; new imports go
    after the last top-level import anyway, so the visitor only needs the
    statements up to there.
    """
    if not context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        return module
    body = list(module.body)
    is_import = m.SimpleStatementLine(body=[m.ZeroOrMore(), m.Import() | m.ImportFrom(), m.ZeroOrMore()])
    last = max((i for i, s in enumerate(body) if m.matches(s, is_import)), default=-1)
    header = module.with_changes(body=body[: last + 1])
    header = AddImportsVisitor(context).transform_module(header)
    return module.with_changes(body=list(header.body) + body[last + 1 :])
