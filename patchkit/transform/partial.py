"""Parse only what a file's codemods read (issue 45: a cold apply's cost).

Most codemods change one top-level class (``ClassCodemod``): they never look
at the file's other top-level classes and functions. ``parse`` hands them a
module where each top-level ``class``/``def`` none of them names is a
:class:`Verbatim` node holding its source lines as they are: libcst parses
the rest (imports, module statements, the classes named), and code
generation writes the verbatim lines back unchanged. A big module whose
change sits in one class (``scheduler.py``: 170 KB) costs a fraction of a
whole parse and of a whole code generation.

``None`` (the caller parses the whole file) whenever that shortcut is not
plainly right: a codemod of the file reads the whole module
(``PatchCodemod.top_level_names`` is None), the file has ``\\r`` line ends, no
final newline or a byte-order mark, nothing is worth leaving out, or the
skeleton does not parse as expected. The module generates the file's exact
bytes, with the indentation libcst would detect on the whole file
(tests/test_transform_partial.py compares both ways on real trees).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import libcst as cst
from libcst._nodes.internal import visit_sequence

# A left-out statement stands in the skeleton as this one-line assignment.
_PLACEHOLDER = "__patchkit_verbatim_{}__"
# Below this many bytes, or this share of the file, left out, a whole parse
# costs about the same: the check that the module generates the file's bytes
# is a code generation of the part parsed.
_WORTH = 4096
_SHARE = 0.25


@dataclass(frozen=True)
class Verbatim(cst.BaseCompoundStatement):
    """A top-level statement kept as its source lines (``text``, each ending
    in a newline), after the blank lines and comments before it."""

    text: str
    leading_lines: Sequence[cst.EmptyLine] = ()

    def _visit_and_replace_children(self, visitor) -> "Verbatim":
        return Verbatim(self.text, visit_sequence(self, "leading_lines", self.leading_lines, visitor))

    def _codegen_impl(self, state) -> None:
        for line in self.leading_lines:
            line._codegen(state)
        state.add_token(self.text)


Reads = dict[str, Optional[frozenset[str]]]  # top-level name -> None (all of it) or the methods read
_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_METHODS = (ast.FunctionDef, ast.AsyncFunctionDef)


def names_read(codemods: Iterable[type]) -> Optional[Reads]:
    """What ``codemods`` read together (``PatchCodemod.reads``; None: one
    reads the whole module)."""
    merged: Reads = {}
    for codemod in codemods:
        wanted = codemod.reads()
        if wanted is None:
            return None
        for name, methods in wanted.items():
            if name in merged and (merged[name] is None or methods is None):
                merged[name] = None
            else:
                merged[name] = (merged.get(name) or frozenset()) | methods if methods is not None else None
    return merged


def parse(source: bytes, reads: Optional[Reads]) -> Optional[cst.Module]:
    """``source`` parsed with what ``reads`` leaves out verbatim: each
    top-level class and function it does not name, and in a class it names
    with methods, every other method. None where a whole parse must be made."""
    if reads is None or b"\r" in source or not source.endswith(b"\n") or source.startswith(b"\xef\xbb\xbf"):
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None  # the whole parse reports it
    lines = source.splitlines(keepends=True)
    regions = []  # (first line, last line, indentation) of each statement left out, in order
    for stmt in tree.body:
        if isinstance(stmt, _DEFS) and stmt.name not in reads:
            regions.append(_region(stmt, b"", lines))
        elif isinstance(stmt, ast.ClassDef) and reads.get(stmt.name) is not None:
            for item in stmt.body:
                if isinstance(item, _METHODS) and item.name not in reads[stmt.name] and item.lineno > stmt.lineno:
                    regions.append(_region(item, lines[item.lineno - 1][: item.col_offset], lines))
    left_out = sum(len(line) for first, last, _ in regions for line in lines[first - 1:last])
    if left_out < _WORTH or left_out < len(source) * _SHARE:
        return None
    skeleton, texts, at = [], {}, 0
    for k, (first, last, indent) in enumerate(regions):
        if indent.strip():
            return None  # not a method on lines of its own
        skeleton.extend(lines[at:first - 1])
        name = _PLACEHOLDER.format(k)
        skeleton.append(indent + f"{name} = None\n".encode())
        texts[name] = b"".join(lines[first - 1:last])
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
    known, indent = _first_indent(tree, lines)
    if left or not known or (indent is not None and indent != module.default_indent):
        return None  # (a block indented unlike the file's first one would be generated with the latter)
    module = module.with_changes(body=body)
    # The file's bytes, or a whole parse: what is written back must be what was read.
    return module if module.bytes == source else None


def _region(stmt: ast.stmt, indent: bytes, lines: list[bytes]) -> tuple[int, int, bytes]:
    """The lines of ``stmt``: its decorators to its last line, and the
    comments after it indented deeper than ``indent`` (its body's, to libcst;
    left in the skeleton, libcst's parser drops them at the end of a file)."""
    first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
    last = stmt.end_lineno
    for number in range(last + 1, len(lines) + 1):
        text = lines[number - 1]
        code = text.lstrip()
        if code.startswith(b"#") and len(text) - len(code) > len(indent):
            last = number
        elif code:
            break
    return first, last, indent


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
