"""Imports: what a module already imports, and adding one.

Codemods ask with ``PatchCodemod.require_import``, the one way a patch adds an
import; the engine adds what the file lacks once every codemod ran
(``add_needed_imports``): to the import block (``add_imports``), or, asked
``among_siblings``, beside the from-imports closest to it in isort order,
where a formatter would put it (``add_import_sorted``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext

from patchkit.codemods.common.primitives.snippets import parse_statement

# Where a codemod's ``require_import`` requests wait for the engine (one list
# per file, in request order).
IMPORTS_KEY = "patchkit.imports"


def require_import(
    context: CodemodContext, module: str, obj: Optional[str] = None, among_siblings: bool = False
) -> None:
    """Ask for ``from module import obj`` (or ``import module``) in the file
    ``context`` belongs to; ``add_needed_imports`` adds what is missing
    (``among_siblings``: a from-import placed by ``add_import_sorted``)."""
    if among_siblings and obj is None:
        raise ValueError("only a from-import is placed among its siblings")
    context.scratch.setdefault(IMPORTS_KEY, []).append((module, obj, among_siblings))


def add_needed_imports(module: cst.Module, context: CodemodContext) -> cst.Module:
    """Add the imports ``require_import`` asked for: those placed among their
    siblings first, in the order asked, then the rest into the import block
    (``add_imports``), which sees the first ones as imported."""
    wanted = context.scratch.get(IMPORTS_KEY, ())
    for mod, obj, among_siblings in wanted:
        if among_siblings:
            module = add_import_sorted(module, mod, obj)
    return add_imports(module, [(mod, obj) for mod, obj, among_siblings in wanted if not among_siblings])


_IS_IMPORT = m.SimpleStatementLine(body=[m.ZeroOrMore(), m.Import() | m.ImportFrom(), m.ZeroOrMore()])
_FUTURE = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])


def _import_header(body: Sequence[cst.BaseStatement]) -> tuple[int, int]:
    """[first, last] of the block of imports that starts at the first ordinary
    import (after ``from __future__`` imports and a module string that follows
    them, where sglang has one); the whole top when there is no ordinary import."""
    imports = [i for i, s in enumerate(body) if m.matches(s, _IS_IMPORT)]
    ordinary = [i for i in imports if not m.matches(body[i], _FUTURE)]
    if not ordinary:
        return 0, (imports[-1] if imports else -1)
    first = last = ordinary[0]
    while last + 1 < len(body) and m.matches(body[last + 1], _IS_IMPORT):
        last += 1
    return first, last


def _single_import(stmt: cst.BaseStatement) -> Optional[Union[cst.Import, cst.ImportFrom]]:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))
    ):
        return stmt.body[0]
    return None


def _is_module_string(stmt: cst.BaseStatement) -> bool:
    """A docstring or ``__strict__ = ...`` first statement (imports go below it)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
        return True
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value == "__strict__"
    )


def add_imports(module: cst.Module, wanted: Sequence[tuple[str, Optional[str]]]) -> cst.Module:
    """Add ``from mod import obj`` / ``import mod`` for each ``(mod, obj)`` the
    module's import block lacks, touching only that block (a 3k-line module is
    never visited). Within the block (see ``_import_header``), the leading run
    of one-import lines is what counts as imported: a name already imported
    there is skipped; a module already imported from there gets the new names
    first, sorted (``from mod import new, old``); the rest go after that run as
    new lines: ``import mod`` sorted, then ``from mod import a, b`` sorted by
    module and name, with a blank line kept before the next statement of the
    block. (This is what libcst's AddImportsVisitor does on that block, byte for
    byte; tests/unit/test_primitives.py compares the two.)"""
    if not wanted:
        return module
    if any(mod == "__future__" for mod, _ in wanted):
        raise ValueError("__future__ imports are not added by patchkit")
    body = list(module.body)
    first, last = _import_header(body)
    header = body[first : last + 1]
    start = 1 if header and _is_module_string(header[0]) else 0
    end = start
    while end < len(header) and _single_import(header[end]) is not None:
        end += 1
    have_modules: set[str] = set()
    have_objects: dict[str, set[str]] = {}
    for stmt in header[start:end]:
        imp = _single_import(stmt)
        if isinstance(imp, cst.Import):
            have_modules.update(_dotted(a.name) for a in imp.names if a.asname is None)
        elif isinstance(imp, cst.ImportFrom) and not imp.relative and imp.module is not None:
            names = have_objects.setdefault(_dotted(imp.module), set())
            if isinstance(imp.names, cst.ImportStar):
                names.add("*")
            else:
                names.update(_dotted(a.name) for a in imp.names if a.asname is None)
    new_modules = sorted({mod for mod, obj in wanted if obj is None} - have_modules)
    objects: dict[str, set[str]] = {}
    for mod in sorted({mod for mod, obj in wanted if obj is not None}):
        have = have_objects.get(mod, set())
        missing = set() if "*" in have else {obj for m_, obj in wanted if m_ == mod and obj is not None} - have
        if missing:
            objects[mod] = missing
    if not new_modules and not objects:
        return module
    for i in range(start, end):
        imp = _single_import(header[i])
        if (
            isinstance(imp, cst.ImportFrom)
            and not imp.relative
            and imp.module is not None
            and not isinstance(imp.names, cst.ImportStar)
            and _dotted(imp.module) in objects
        ):
            names = objects.pop(_dotted(imp.module))
            merged = imp.with_changes(names=[*(cst.ImportAlias(name=cst.Name(n)) for n in sorted(names)), *imp.names])
            header[i] = header[i].with_changes(body=[merged])
    if new_modules or objects:
        config = module.config_for_parsing
        added = [cst.parse_statement(f"import {mod}", config=config) for mod in new_modules]
        added += [
            cst.parse_statement(f"from {mod} import {', '.join(sorted(names))}", config=config)
            for mod, names in objects.items()
        ]
        rest = header[end:]
        if rest:
            lines = rest[0].leading_lines
            if not lines or lines[0].comment is not None:
                rest[0] = rest[0].with_changes(leading_lines=(cst.EmptyLine(), *lines))
        header = header[:end] + added + rest
    return module.with_changes(body=body[:first] + header + body[last + 1 :])


def _dotted(node: Optional[cst.BaseExpression]) -> str:
    if node is None:
        return ""
    return cst.Module(body=[]).code_for_node(node)


def _top_level_import_from(stmt: cst.BaseStatement) -> Optional[cst.ImportFrom]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.ImportFrom):
        imp = stmt.body[0]
        if not imp.relative and imp.module is not None:
            return imp
    return None


def imports_name(module: cst.Module, module_name: str, name: str) -> bool:
    """Does the module bind ``name`` with a top-level ``from module_name import ...``?"""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and not small.relative and _dotted(small.module) == module_name:
                    if isinstance(small.names, cst.ImportStar):
                        return True
                    for alias in small.names:
                        bound = (
                            alias.asname.name.value
                            if alias.asname and isinstance(alias.asname.name, cst.Name)
                            else _dotted(alias.name)
                        )
                        if bound == name and _dotted(alias.name) == name:
                            return True
    return False


def add_import_sorted(module: cst.Module, module_name: str, name: str) -> cst.Module:
    """Add ``from module_name import name`` among the top-level from-imports
    closest to it (longest common dotted prefix), in isort order (case-folded
    module names), so the new line sits where a formatter would put it. No-op
    when the name is already imported from there. Without any sibling it goes
    after the last top-level import (or at the top)."""
    if imports_name(module, module_name, name):
        return module
    target = module_name.split(".")
    body = list(module.body)
    best, group = -1, []
    for i, stmt in enumerate(body):
        imp = _top_level_import_from(stmt)
        if imp is None:
            continue
        parts = _dotted(imp.module).split(".")
        common = next((k for k, (a, b) in enumerate(zip(parts, target)) if a != b), min(len(parts), len(target)))
        if common > best:
            best, group = common, [(i, _dotted(imp.module))]
        elif common == best:
            group.append((i, _dotted(imp.module)))
    new = parse_statement(f"from {module_name} import {name}")
    later: list[int] = []
    if group and best > 0:
        later = [i for i, mod_name in group if mod_name.lower() > module_name.lower()]
        index = later[0] if later else group[-1][0] + 1
    else:
        is_import = m.SimpleStatementLine(body=[m.ZeroOrMore(), m.Import() | m.ImportFrom(), m.ZeroOrMore()])
        index = max((i + 1 for i, s in enumerate(body) if m.matches(s, is_import)), default=0)
    if later:
        # Blank lines above the statement we go before (a section break) move
        # above us; comments stay with the statement they describe.
        following = body[index]
        lines = list(following.leading_lines)
        blank = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
        new = new.with_changes(leading_lines=lines[:blank])
        body[index] = following.with_changes(leading_lines=lines[blank:])
    body.insert(index, new)
    return module.with_changes(body=body)
