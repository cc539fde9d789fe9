"""A module's scopes and the leaf tokens of each, for ``patchkit.transform.vendor_code``.

A scope is a function or class at any depth, by qualified name, or the
module's own statements (``MODULE_SCOPE``); its own text and its *leaf
tokens* (names, attribute and keyword names, constants, operators, statement
kinds, in source order) leave out the scopes nested in it, so a change inside
a method is that method's alone. Standard library only (``ast``).
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Iterator, Optional

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
MODULE_SCOPE = "<module>"

Token = tuple[str, int]  # (normalized token, line)


Scope = tuple[ast.AST, list[ast.AST]]  # the node, its directly nested definitions


def scopes(tree: ast.Module) -> dict[str, Scope]:
    """Every function and class at any depth, by qualified name (``C.f``; a
    second definition of one name gets ``#2``), plus the module itself."""
    found: dict[str, Scope] = {MODULE_SCOPE: (tree, [])}
    seen: Counter = Counter()

    def visit(body: list, prefix: str, children: list) -> None:
        for stmt in body:
            if isinstance(stmt, _DEFS):
                children.append(stmt)
                name = prefix + stmt.name
                seen[name] += 1
                key = name if seen[name] == 1 else f"{name}#{seen[name]}"
                found[key] = (stmt, [])
                visit(stmt.body, key + ".", found[key][1])
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    inner = getattr(stmt, field, None)
                    if inner:
                        visit(inner, prefix, children)

    visit(tree.body, "", found[MODULE_SCOPE][1])
    return found


def _first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])


def own_text(lines: list[bytes], node: ast.AST, children: list[ast.AST]) -> bytes:
    """The scope's source less its nested definitions (decorators included):
    equal texts mean equal own tokens, so most scopes are never tokenized."""
    first, last = (1, len(lines)) if isinstance(node, ast.Module) else (_first_line(node), node.end_lineno)
    parts, at = [], first
    for child in children:
        parts.append(b"".join(lines[at - 1 : _first_line(child) - 1]))
        at = child.end_lineno + 1
    parts.append(b"".join(lines[at - 1 : last]))
    return b"\0".join(parts)


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _leaf(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield "." + node.attr
    elif isinstance(node, ast.Constant):
        yield repr(node.value)
    elif isinstance(node, ast.keyword):
        yield f"{node.arg}=" if node.arg else "**"
    elif isinstance(node, ast.arg):
        yield node.arg
    elif isinstance(node, ast.alias):
        yield node.name if node.asname is None else f"{node.name} as {node.asname}"
    elif isinstance(node, ast.BoolOp):
        yield from [type(node.op).__name__.lower()] * (len(node.values) - 1)
    elif isinstance(node, ast.Compare):
        yield from (type(op).__name__ for op in node.ops)
    elif isinstance(node, ast.UnaryOp):
        yield type(node.op).__name__
    elif isinstance(node, ast.stmt) and not isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)):
        yield type(node).__name__  # return, pass, raise, if ...: what a statement is


def tokens(scope: ast.AST, children: list[ast.AST]) -> list[Token]:
    """The scope's own leaf tokens in source order (a dotted name is one
    token): nested functions and classes are scopes of their own, only their
    name stays here."""
    out: list[tuple[int, int, str]] = []
    nested = {id(c) for c in children}
    if isinstance(scope, ast.Module):
        stack: list[ast.AST] = list(scope.body)
    else:
        kind = "class " if isinstance(scope, ast.ClassDef) else "def "
        out.append((scope.lineno, scope.col_offset, kind + scope.name))
        stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if id(node) in nested:
            kind = "class " if isinstance(node, ast.ClassDef) else "def "
            out.append((node.lineno, node.col_offset, kind + node.name))
            continue
        line = getattr(node, "lineno", None)
        if line is None:
            if not isinstance(node, (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)):
                stack.extend(ast.iter_child_nodes(node))
            continue
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                out.append((line, node.col_offset, dotted))
                continue
        if isinstance(node, (ast.BoolOp, ast.Compare)):
            # Each operator where its right operand starts, not all at the expression's start.
            ops = [type(node.op).__name__.lower()] * (len(node.values) - 1) if isinstance(node, ast.BoolOp) else \
                [type(op).__name__ for op in node.ops]
            rights = node.values[1:] if isinstance(node, ast.BoolOp) else node.comparators
            out.extend((r.lineno, r.col_offset - 1, op) for op, r in zip(ops, rights))
        else:
            col = node.col_offset
            for token in _leaf(node):
                out.append((line, col, token))
        stack.extend(ast.iter_child_nodes(node))
    out.sort()
    return [(token, line) for line, _, token in out]
