"""Parse only what a file's codemods read (issue 45: a cold apply's cost).

Most codemods change one top-level class (``ClassCodemod``), often one
method of it: they never look at the file's other top-level classes and
functions, nor at the methods they do not declare (``reads.Methods``: by
name, or by a word the method's source must hold). ``parse`` hands them a
module where each of those is a :class:`Verbatim` node holding its source
lines as they are: libcst parses the rest (imports, module statements, the
classes' own statements, the methods read), and code generation writes the
verbatim lines back unchanged. A big module whose
change sits in one class (``scheduler.py``: 170 KB) costs a fraction of a
whole parse and of a whole code generation.

``None`` (the caller parses the whole file) whenever that shortcut is not
plainly right: a codemod of the file reads the whole module
(``PatchCodemod.reads`` is None), the file has ``\\r`` line ends, no
final newline or a byte-order mark, nothing is worth leaving out, or the
skeleton does not parse as expected. The module generates the file's exact
bytes, with the indentation libcst would detect on the whole file
(tests/trees/test_transform_partial.py compares both ways on real trees).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst

from patchkit import python_ast
from patchkit.codemods.common import primitives
from patchkit.codemods.common.primitives.module import Verbatim
from patchkit.codemods.common.reads import EVERY, Reads, merged

if TYPE_CHECKING:
    from patchkit.codemods.common.base import PatchCodemod

# A left-out statement stands in the skeleton as this one-line assignment.
_PLACEHOLDER = "__patchkit_verbatim_{}__"
# Below this many bytes, or this share of the file, left out, a whole parse
# costs about the same: the check that the module generates the file's bytes
# is a code generation of the part parsed.
_WORTH = 4096
_SHARE = 0.25


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_METHODS = (ast.FunctionDef, ast.AsyncFunctionDef)
Definition = Union[ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef]


def names_read(codemods: Iterable[type["PatchCodemod"]]) -> Optional[Reads]:
    """What ``codemods`` read together (``PatchCodemod.reads``; None: one
    reads the whole module)."""
    return merged([codemod.reads() for codemod in codemods])


def parse(source: bytes, reads: Optional[Reads]) -> Optional[cst.Module]:
    """``source`` parsed with what ``reads`` leaves out verbatim: each
    top-level class and function it does not name, and in a class it names
    with methods, every other method. None where a whole parse must be made."""
    if reads is None or b"\r" in source or not source.endswith(b"\n") or source.startswith(b"\xef\xbb\xbf"):
        return None
    try:  # shared with the audit of the same bytes in this process (python_ast)
        tree = python_ast.parse(source)
    except (SyntaxError, ValueError):
        return None  # the whole parse reports it
    lines = source.splitlines(keepends=True)
    every = reads.get(EVERY)
    if EVERY in reads and every is None:
        return None
    regions = []  # (first line, last line, indentation) of each statement left out, in order
    for stmt in tree.body:
        if not isinstance(stmt, _DEFS) or (stmt.name in reads and reads[stmt.name] is None):
            continue  # parsed: a statement, or a definition read whole
        methods = reads.get(stmt.name)
        if every is not None:
            methods = every if methods is None else methods | every
        region = _region(stmt, b"", lines)
        if methods is None or (
            not isinstance(stmt, ast.ClassDef) and not methods.read(stmt.name, _text(region, lines))
        ):
            regions.append(region)
        elif isinstance(stmt, ast.ClassDef):
            for item in stmt.body:
                if isinstance(item, _METHODS) and item.lineno > stmt.lineno:
                    region = _region(item, lines[item.lineno - 1][: item.col_offset], lines)
                    if not methods.read(item.name, _text(region, lines)):
                        regions.append(region)
    left_out = sum(len(line) for first, last, _ in regions for line in lines[first - 1 : last])
    if left_out < _WORTH or left_out < len(source) * _SHARE:
        return None
    skeleton, texts, at = [], {}, 0
    for k, (first, last, indent) in enumerate(regions):
        if indent.strip():
            return None  # not a method on lines of its own
        skeleton.extend(lines[at : first - 1])
        name = _PLACEHOLDER.format(k)
        skeleton.append(indent + f"{name} = None\n".encode())
        texts[name] = b"".join(lines[first - 1 : last])
        at = last
    skeleton.extend(lines[at:])
    try:
        module = cst.parse_module(b"".join(skeleton))
    except cst.ParserSyntaxError:
        return None
    left = dict(texts)

    def verbatim(body: Sequence) -> list:
        out = []
        for stmt in body:
            name = _placeholder_name(stmt)
            if name in left:
                stmt = Verbatim(left.pop(name).decode(module.encoding), tuple(stmt.leading_lines))
            elif type(stmt) is cst.ClassDef and isinstance(stmt.body, cst.IndentedBlock):
                inner = verbatim(stmt.body.body)
                if any(type(s) is Verbatim for s in inner):
                    stmt = stmt.with_changes(body=stmt.body.with_changes(body=inner))
            out.append(stmt)
        return out

    body = verbatim(module.body)
    known, first_indent = _first_indent(tree, lines)
    if left or not known or (first_indent is not None and first_indent != module.default_indent):
        return None  # (a block indented unlike the file's first one would be generated with the latter)
    module = module.with_changes(body=body)
    # The file's bytes, or a whole parse: what is written back must be what was read.
    if module.bytes != source:
        return None
    primitives.remember_starts(module, _starts(module, tree))
    return module


def _region(stmt: Definition, indent: bytes, lines: list[bytes]) -> tuple[int, int, bytes]:
    """The lines of ``stmt``: its decorators to its last line, and the
    comments after it indented deeper than ``indent`` (its body's, to libcst;
    left in the skeleton, libcst's parser drops them at the end of a file)."""
    first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
    last = stmt.end_lineno or stmt.lineno  # ast.parse sets it; None only on nodes built by hand
    for number in range(last + 1, len(lines) + 1):
        text = lines[number - 1]
        code = text.lstrip()
        if code.startswith(b"#") and len(text) - len(code) > len(indent):
            last = number
        elif code:
            break
    return first, last, indent


def _starts(module: cst.Module, tree: ast.Module) -> list[tuple[cst.CSTNode, int, bool]]:
    """Where each parsed function, method and class starts (``primitives.line_of``):
    the module's definitions, parsed or verbatim, are the ast's in order."""
    starts: list[tuple[cst.CSTNode, int, bool]] = []
    for stmt, node in zip(_definitions(module.body, cst.ClassDef), [s for s in tree.body if isinstance(s, _DEFS)]):
        if type(stmt) is cst.ClassDef and isinstance(stmt.body, cst.IndentedBlock):
            methods = [i for i in node.body if isinstance(i, _METHODS)]
            starts += [
                (f, i.lineno, False)
                for f, i in zip(_definitions(stmt.body.body), methods)
                if type(f) is cst.FunctionDef
            ]
        if type(stmt) is not Verbatim:
            starts.append((stmt, node.lineno, type(stmt) is cst.ClassDef))
    return starts


def _definitions(body: Sequence, *also: type) -> list:
    """The functions (and ``also``) of ``body``, parsed or verbatim."""
    return [s for s in body if type(s) in (cst.FunctionDef, Verbatim, *also)]


def _text(region: tuple[int, int, bytes], lines: list[bytes]) -> bytes:
    return b"".join(lines[region[0] - 1 : region[1]])


def _placeholder_name(stmt: cst.CSTNode) -> Optional[str]:
    if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Assign:
        target = stmt.body[0].targets[0].target
        if type(target) is cst.Name and target.value.startswith("__patchkit_verbatim_"):
            return target.value
    return None


def _first_indent(tree: ast.Module, lines: list[bytes]) -> tuple[bool, Optional[str]]:
    """The whole file's first indentation (libcst's ``default_indent``: new
    code is indented with it), which the skeleton may lack: that of the
    first block, in source order, that starts on a line of its own;
    ``(True, None)``: the file has no such block; ``(False, None)``: not
    told this way (a ``match`` comes first)."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Match):
            return False, None
        body = getattr(stmt, "body", None)
        if isinstance(body, list) and body and body[0].lineno > stmt.lineno:
            prefix = lines[body[0].lineno - 1][: body[0].col_offset]
            if prefix and not prefix.strip():  # else the body follows a header's last line
                return True, prefix.decode("ascii")
    return True, None
