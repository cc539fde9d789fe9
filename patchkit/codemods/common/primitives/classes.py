"""Inside a class: its body, bases, methods (find, replace, add) and class attributes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common.primitives.module import FunctionEdit, _find_named, find_function, is_definition
from patchkit.codemods.common.primitives.snippets import (
    AnchorError,
    Statement,
    _docstring_count,
    block_statements,
    parse_statement,
)


def class_body(cls: cst.ClassDef) -> Sequence[Statement]:
    body = cls.body
    return block_statements(body) if isinstance(body, cst.IndentedBlock) else ()


def _with_class_body(cls: cst.ClassDef, statements: Sequence[Statement]) -> cst.ClassDef:
    return cls.with_changes(body=cls.body.with_changes(body=list(statements)))


def base_names(cls: cst.ClassDef) -> list[str]:
    """Names of the bases as written (``Base`` or ``mod.Base`` -> ``Base``)."""
    names = []
    for arg in cls.bases:
        value = arg.value
        if isinstance(value, cst.Attribute):
            names.append(value.attr.value)
        elif isinstance(value, cst.Name):
            names.append(value.value)
    return names


def methods(cls: cst.ClassDef) -> Iterator[cst.FunctionDef]:
    for stmt in class_body(cls):
        if isinstance(stmt, cst.FunctionDef):
            yield stmt


def find_method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    return next((f for f in methods(cls) if f.name.value == name), None)


def decorators_defined_beside(
    fn: cst.FunctionDef, cls: cst.ClassDef, module: Optional[cst.Module]
) -> list[cst.FunctionDef]:
    """The functions that decorate ``fn`` (``@NAME`` or ``@NAME(...)``) defined beside it: a
    method of ``cls`` (``@staticmethod def draft_wrapper(f)``, a fork's wrapper), else a
    top-level function of ``module`` (when given)."""
    out = []
    for decorator in fn.decorators:
        node = decorator.decorator
        node = node.func if isinstance(node, cst.Call) else node
        if not isinstance(node, cst.Name):
            continue
        found = find_method(cls, node.value)
        if found is None and module is not None:
            found = find_function(module, node.value)
        if found is not None and found is not fn:
            out.append(found)
    return out


def find_first_method(cls: cst.ClassDef, names: Sequence[str]) -> Optional[cst.FunctionDef]:
    """The first of several alternative names (a method renamed across releases)."""
    for name in names:
        found = find_method(cls, name)
        if found is not None:
            return found
    return None


def replace_method(cls: cst.ClassDef, name: str, edit: FunctionEdit) -> cst.ClassDef:
    body = list(class_body(cls))
    index = _find_named(body, cst.FunctionDef, name)
    method = None if index is None else body[index]
    if index is None or not isinstance(method, cst.FunctionDef):
        raise AnchorError(f"{cls.name.value}.{name}")
    body[index] = edit(method)
    return _with_class_body(cls, body)


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


def _assigned_name(stmt: Statement) -> Optional[str]:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        target = small.targets[0].target
        return target.value if isinstance(target, cst.Name) else None
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
        return small.target.value
    return None


def find_class_attribute(cls: cst.ClassDef, name: str) -> Optional[cst.BaseSmallStatement]:
    """``name = ...`` or ``name: T = ...`` directly in the class body."""
    for stmt in class_body(cls):
        if isinstance(stmt, cst.SimpleStatementLine) and _assigned_name(stmt) == name:
            return stmt.body[0]
    return None


def add_class_attribute(cls: cst.ClassDef, source: str) -> cst.ClassDef:
    """Add ``source`` (e.g. ``flag: bool = False``) at the top of the class body,
    after the docstring, so it reads as part of the class's declaration."""
    body = list(class_body(cls))
    index = _docstring_count(body)
    body.insert(index, parse_statement(source))
    return _with_class_body(cls, body)


def add_dataclass_field(cls: cst.ClassDef, source: str) -> cst.ClassDef:
    """Add ``source`` (``name: T = default``) after the last annotated field of
    the class body: a field with a default must follow the fields without one,
    or the dataclass refuses to build."""
    body = list(class_body(cls))
    fields = [
        i
        for i, stmt in enumerate(body)
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.AnnAssign)
    ]
    if not fields:
        raise AnchorError(f"{cls.name.value}: no annotated field")
    body.insert(fields[-1] + 1, parse_statement(source))
    return _with_class_body(cls, body)


def space_class_attribute(cls: cst.ClassDef, name: str, comment: str = "") -> cst.ClassDef:
    """Lay out the class attribute ``name`` as black would, plus optional
    ``# comment`` lines right above it: a blank line separates it from a
    docstring above it and from a method or class right after it."""
    body = list(class_body(cls))
    index = next((i for i, stmt in enumerate(body) if _assigned_name(stmt) == name), None)
    if index is None:
        raise AnchorError(f"{cls.name.value}.{name}")
    stmt = body[index]
    lines = list(stmt.leading_lines)
    if comment:
        lines += [cst.EmptyLine(comment=cst.Comment(f"# {text}".rstrip())) for text in comment.splitlines()]
    if index == 1 and _docstring_count(body) and not _starts_blank(lines):
        lines.insert(0, cst.EmptyLine(indent=False))
    body[index] = stmt.with_changes(leading_lines=lines)
    following = body[index + 1] if index + 1 < len(body) else None
    if following is not None and is_definition(following) and not _starts_blank(following.leading_lines):
        body[index + 1] = following.with_changes(leading_lines=[cst.EmptyLine(indent=False), *following.leading_lines])
    return _with_class_body(cls, body)


def _starts_blank(lines: Sequence[cst.EmptyLine]) -> bool:
    return bool(lines) and lines[0].comment is None
