"""One walk over a module for ``patchkit audit``: its classes (bases by
name, what they declare for ``needs_cpu_seq_lens``, the names they call) and
its loads of the CPU seq_lens mirror. ``audit_ast`` classifies those loads;
``audit_facts`` follows the classes across the tree.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional, cast

MIRROR = ("seq_lens_cpu", "seq_lens_sum")
FLAG = "needs_cpu_seq_lens"
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class ClassFacts:
    name: str
    bases: list[str]  # the last name of each base (``a.B`` -> ``B``)
    flag: Optional[str] = None  # what it declares for needs_cpu_seq_lens: "True", "False", "dynamic", None
    calls: set[str] = field(default_factory=set)  # the names it calls (a wrapper builds backends)


def scan(tree: ast.Module, parents: Optional[dict] = None) -> tuple[dict[str, ClassFacts], list[ast.Attribute]]:
    """One pass over the module: its classes (bases, flag, calls; a later one
    of a name wins, as at import) and its loads of a mirror attribute (`+=` included); fills
    ``parents`` (child -> parent) when given. One hand-written walk: the ast
    module's walk costs more than parsing on big modules."""
    classes: dict[str, ClassFacts] = {}
    lines: dict[str, int] = {}
    reads: list[ast.Attribute] = []
    stack: list[tuple[ast.AST, Optional[ClassFacts]]] = [(tree, None)]
    AST, Attribute, Call, ClassDef, Load = ast.AST, ast.Attribute, ast.Call, ast.ClassDef, ast.Load
    while stack:
        node, cls = stack.pop()
        kind = type(node)
        # (cast: ``kind is X`` tells the type as isinstance would, faster, but mypy does not read it)
        if kind is ClassDef:
            cdef = cast(ast.ClassDef, node)
            cls = ClassFacts(cdef.name, [b for b in map(_last_name, cdef.bases) if b], _body_flag(cdef))
            if cdef.lineno >= lines.get(cdef.name, 0):
                classes[cdef.name], lines[cdef.name] = cls, cdef.lineno
        elif kind is Call:
            if cls is not None:
                name = _last_name(cast(ast.Call, node).func)
                if name:
                    cls.calls.add(name)
        elif kind is Attribute:
            attribute = cast(ast.Attribute, node)
            if attribute.attr in MIRROR and type(attribute.ctx) is Load:
                reads.append(attribute)
        elif kind is ast.AugAssign:  # `x.seq_lens_sum += n` reads it too
            target = cast(ast.AugAssign, node).target
            if isinstance(target, Attribute) and target.attr in MIRROR:
                reads.append(target)
        elif cls is not None and (kind is ast.Assign or kind is ast.AnnAssign):
            value = _flag_value(node, _self_flag)
            if value is not None and cls.flag != "False":
                cls.flag = value if cls.flag is None or value == "False" else cls.flag
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, AST):
                        stack.append((item, cls))
                        if parents is not None:
                            parents[item] = node
            elif isinstance(value, AST):
                stack.append((value, cls))
                if parents is not None:
                    parents[value] = node
    reads.sort(key=lambda n: (n.lineno, n.col_offset))
    return classes, reads


def _self_flag(target: ast.AST) -> bool:
    return (
        isinstance(target, ast.Attribute)
        and target.attr == FLAG
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    )


def _last_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Subscript):  # Generic[T], Base[...]
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _body_flag(cls: ast.ClassDef) -> Optional[str]:
    """``needs_cpu_seq_lens = False`` / ``True`` in the class body (annotated
    or not); a property or any other value is "dynamic" (may opt out). A
    ``self.needs_cpu_seq_lens = ...`` in a method counts too (see scan)."""
    flag = None
    for stmt in cls.body:
        if isinstance(stmt, FUNCTIONS) and stmt.name == FLAG:
            flag = "dynamic"
        value = _flag_value(stmt, lambda t: isinstance(t, ast.Name) and t.id == FLAG)
        if value is not None:
            flag = value
    return flag


def _flag_value(stmt: ast.AST, named) -> Optional[str]:
    targets: list[ast.expr]
    if isinstance(stmt, ast.AnnAssign):
        targets, value = [stmt.target], stmt.value
    elif isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    else:
        return None
    if value is None or not any(named(t) for t in targets):
        return None
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return str(value.value)
    return "dynamic"
