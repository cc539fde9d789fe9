"""A fork-drift generator for tests: rewrite real sglang files the ways vendor
forks drift (formatting, comments, order, extra code, import style) without
changing what they mean."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import libcst as cst
import libcst.matchers as m


class _Comments(cst.CSTTransformer):
    """Comment and blank line above every def/class and every other statement."""

    def __init__(self) -> None:
        self.n = 0

    def _mark(self, node):
        self.n += 1
        lines = [cst.EmptyLine(), cst.EmptyLine(comment=cst.Comment(f"# fork note {self.n}"))]
        return node.with_changes(leading_lines=[*node.leading_lines, *lines])

    def leave_FunctionDef(self, original, updated):
        return self._mark(updated) if not updated.decorators else updated

    def leave_ClassDef(self, original, updated):
        return self._mark(updated) if not updated.decorators else updated

    def leave_SimpleStatementLine(self, original, updated):
        self.n += 1
        if self.n % 3:
            return updated
        return updated.with_changes(
            leading_lines=[*updated.leading_lines, cst.EmptyLine(comment=cst.Comment("# fork: reviewed"))]
        )


class _ReorderAndExtend(cst.CSTTransformer):
    """Reverse the order of undecorated methods; optionally add unrelated members."""

    def __init__(self, reorder: bool, extend: bool) -> None:
        self.reorder, self.extend = reorder, extend

    def leave_ClassDef(self, original, updated):
        if not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        if self.reorder:
            slots = [i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and not s.decorators]
            moved = [body[i] for i in reversed(slots)]
            for i, stmt in zip(slots, moved):
                body[i] = stmt
        if self.extend:
            extra = cst.parse_module(
                "_fork_flag = True\n\ndef _fork_helper(self, value=None):\n    return value\n"
            ).body
            docstring = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
            body[docstring:docstring] = [extra[0]]
            body.append(extra[1].with_changes(leading_lines=[cst.EmptyLine()]))
        return updated.with_changes(body=updated.body.with_changes(body=body))


class _SplitImports(cst.CSTTransformer):
    """``from x import (a, b)`` -> one ``from x import a as a`` per line."""

    def leave_SimpleStatementLine(self, original, updated):
        if len(updated.body) != 1 or not m.matches(updated.body[0], m.ImportFrom()):
            return updated
        imp = updated.body[0]
        if isinstance(imp.names, cst.ImportStar) or imp.relative or (m.matches(imp.module, m.Name("__future__"))):
            return updated
        lines = []
        for alias in imp.names:
            name = alias.name
            asname = alias.asname or (cst.AsName(name=cst.Name(name.value)) if isinstance(name, cst.Name) else None)
            single = imp.with_changes(names=[cst.ImportAlias(name=name, asname=asname)], lpar=None, rpar=None)
            lines.append(cst.SimpleStatementLine(body=[single]))
        lines[0] = lines[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel(lines)


class _Instrument(cst.CSTTransformer):
    """What a fork adds to profile its code: a trace call at the start of every
    function (after its docstring) and before every ``return`` and ``raise``
    written as a statement of its own, and every method's timing kept in a
    local. Nothing it adds is read by the code around it."""

    ENTER = 'import logging as _fork_logging; _fork_logging.getLogger(__name__).debug("fork: enter %s", "{name}")\n'
    TIMER = '_fork_t0 = __import__("time").perf_counter()\n'
    LEAVE = '_fork_logging.getLogger(__name__).debug("fork: leave {name} after %.3f s", __import__("time").perf_counter() - _fork_t0)\n'

    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_FunctionDef(self, node):
        self.names.append(node.name.value)

    def leave_IndentedBlock(self, original, updated):
        if not self.names:
            return updated
        body: list = []
        for stmt in updated.body:
            if m.matches(stmt, m.SimpleStatementLine(body=[m.Return() | m.Raise()])):
                body.append(cst.parse_statement(self.LEAVE.format(name=self.names[-1])))
            body.append(stmt)
        return updated.with_changes(body=body)

    def leave_FunctionDef(self, original, updated):
        name = self.names.pop()
        if not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        doc = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
        added = [cst.parse_statement(self.ENTER.format(name=name)), cst.parse_statement(self.TIMER)]
        # The first statement keeps its comments above the new ones.
        if len(body) > doc:
            added[0] = added[0].with_changes(leading_lines=body[doc].leading_lines)
            body[doc] = body[doc].with_changes(leading_lines=[])
        body[doc:doc] = added
        return updated.with_changes(body=updated.body.with_changes(body=body))


def _cst(transformer_factory: Callable[[], cst.CSTTransformer]) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        module = cst.parse_module(path.read_bytes())
        path.write_bytes(module.visit(transformer_factory()).bytes)

    return run


def _docstring(path: Path) -> None:
    """Add a module docstring, or extend the one there (a second string before
    ``from __future__`` would not compile)."""
    module = cst.parse_module(path.read_bytes())
    first = module.body[0] if module.body else None
    if first is not None and m.matches(first, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        doc = first.body[0].value
        quote = doc.quote
        extended = doc.with_changes(value=doc.value[: -len(quote)] + "\n\nVendor fork of this module." + quote)
        new_first = first.with_changes(body=[first.body[0].with_changes(value=extended)])
        module = module.with_changes(body=[new_first, *module.body[1:]])
    else:
        doc_line = cst.parse_statement('"""Vendor fork of this module."""\n')
        module = module.with_changes(body=[doc_line, *module.body])
    path.write_bytes(module.bytes)


def _black(*args: str) -> Callable[[list[Path]], None]:
    """black over every file at once: one interpreter start-up, not one per file."""

    def run(paths: list[Path]) -> None:
        subprocess.run([sys.executable, "-m", "black", "-q", *args, *map(str, paths)], check=True)

    run.all_at_once = True
    return run


DRIFTS: dict[str, list[Callable[[Path], None]]] = {
    "black-120": [_black("-l", "120")],
    "black-60-no-magic-comma": [_black("-l", "60", "--skip-magic-trailing-comma")],
    "comments": [_cst(_Comments)],
    "reordered-methods": [_cst(lambda: _ReorderAndExtend(reorder=True, extend=False))],
    "extra-members": [_cst(lambda: _ReorderAndExtend(reorder=False, extend=True))],
    "split-aliased-imports": [_cst(_SplitImports)],
    "module-docstring": [_docstring],
    "instrumentation": [_cst(_Instrument)],
    "everything": [
        _cst(_SplitImports),
        _cst(lambda: _ReorderAndExtend(reorder=True, extend=True)),
        _cst(_Comments),
        _docstring,
        _black("-l", "100"),
    ],
}


def drift(package: Path, relpaths: list[str], name: str) -> None:
    """Rewrite ``relpaths`` of ``package`` the way ``name`` drifts them.

    Each step runs over every file before the next (a step treats files one by
    one, so the bytes are those of file-by-file order). The drifted bytes are
    kept by the files' own bytes (in ``$PATCHKIT_TEST_DRIFT_CACHE``, which the
    test run's workers share, else not kept): the same drift of the same
    files is computed once (the folder outlives the run: its key holds this
    module's code and black's version, which decide the drifted bytes)."""
    paths = [package / rel for rel in relpaths if (package / rel).exists()]
    for path in paths:  # a hard-linked tree (support.linked_copy): edit copies, never the release cache
        own(path)
    todo = []
    for path in paths:
        cached = _drift_cache(name, path.read_bytes())
        if cached is not None and cached.exists():
            path.write_bytes(cached.read_bytes())
        else:
            todo.append((path, cached, path.read_bytes()))
    if not todo:
        return
    for step in DRIFTS[name]:
        if getattr(step, "all_at_once", False):
            step([path for path, _, _ in todo])
        else:
            for path, _, _ in todo:
                step(path)
    for path, cached, _ in todo:
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(path.read_bytes())
            os.replace(tmp, cached)


def own(path: Path) -> None:
    """Break ``path``'s hard link (a linked tree's file shares the release
    cache's bytes): a file of its own with the same bytes, to edit in place."""
    if path.stat().st_nlink > 1:
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)


@functools.cache
def _generator() -> bytes:
    """What decides a drift's bytes besides the input: this module and black."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        black = version("black")
    except PackageNotFoundError:
        black = "none"
    return Path(__file__).read_bytes() + f"\0black {black}\0libcst {version('libcst')}\0".encode()


def _drift_cache(name: str, data: bytes) -> Path | None:
    folder = os.environ.get("PATCHKIT_TEST_DRIFT_CACHE")
    if not folder:
        return None
    return Path(folder) / name / hashlib.sha256(_generator() + data).hexdigest()
