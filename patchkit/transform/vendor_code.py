"""The vendor's code survives a patch: every piece of code a fork added to a
file (what the file has beyond the pristine release it was made from) must
still be in the file after the transform, layout aside.

``lost(pristine, before, after)`` answers it for one file with the standard
library only (``ast``), and cheaply:

- a file that is the release's own bytes has no vendor code: nothing to do;
- only the scopes (functions, classes, the module's own statements) whose
  text the transform changed are looked at; in each, the *leaf tokens*
  (names, attribute and keyword names, constants, operators, statement kinds)
  in source order are aligned with the same scope of the release (vendor
  additions: tokens the release lacks) and of the result (tokens the
  transform removed);
- a vendor token the transform removed is lost unless the scope still has as
  many of it as before (the transform moved it, e.g. into a new ``if``).

The release's bytes come from patchkit's cache (``patchkit.fetch.pristine_source``,
which never downloads: fetching is an explicit step, ``patchkit fetch``).
``transform.run`` calls ``lost``; a loss refuses the site unless the codemod
that removed the code declares it (``PatchCodemod.REPLACES_VENDOR``).
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Optional, Union

from patchkit.errors import EXIT_CHANGES, PatchkitError

if TYPE_CHECKING:
    import libcst as cst

    from patchkit.codemods.common.base import PatchCodemod


@dataclass(frozen=True)
class Lost:
    line: int  # in the file before the transform
    token: str  # the leaf token, as written (a name, a constant, an operator)
    scope: str  # qualified name of the enclosing function or class
    code: str  # the line of source it is on, stripped


# -- scopes and their leaf tokens --------------------------------------------------
# A scope is a function or class at any depth, by qualified name, or the
# module's own statements (MODULE_SCOPE); its own text and its leaf tokens
# (names, attribute and keyword names, constants, operators, statement kinds,
# in source order) leave out the scopes nested in it, so a change inside a
# method is that method's alone.

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
MODULE_SCOPE = "<module>"

Token = tuple[str, int]  # (normalized token, line)


Definition = Union[ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef]
Scope = tuple[Union[ast.Module, Definition], list[Definition]]  # the node, its directly nested definitions


def scopes(tree: ast.Module) -> dict[str, Scope]:
    """Every function and class at any depth, by qualified name (``C.f``; a
    second definition of one name gets ``#2``), plus the module itself."""
    found: dict[str, Scope] = {MODULE_SCOPE: (tree, [])}
    seen: Counter = Counter()

    def visit(body: list[ast.stmt], prefix: str, children: list[Definition]) -> None:
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


def _first_line(node: Definition) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def _last_line(node: Definition) -> int:
    return node.end_lineno or node.lineno  # ast.parse sets it; None only on nodes built by hand


def own_text(lines: list[bytes], node: Union[ast.Module, Definition], children: list[Definition]) -> bytes:
    """The scope's source less its nested definitions (decorators included):
    equal texts mean equal own tokens, so most scopes are never tokenized."""
    first, last = (1, len(lines)) if isinstance(node, ast.Module) else (_first_line(node), _last_line(node))
    parts, at = [], first
    for child in children:
        parts.append(b"".join(lines[at - 1 : _first_line(child) - 1]))
        at = _last_line(child) + 1
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


def tokens(scope: Union[ast.Module, Definition], children: list[Definition]) -> list[Token]:
    """The scope's own leaf tokens in source order (a dotted name is one
    token): nested functions and classes are scopes of their own, only their
    name stays here."""
    out: list[tuple[int, int, str]] = []
    nested = {id(c): c for c in children}
    if isinstance(scope, ast.Module):
        stack: list[ast.AST] = list(scope.body)
    else:
        kind = "class " if isinstance(scope, ast.ClassDef) else "def "
        out.append((scope.lineno, scope.col_offset, kind + scope.name))
        stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if id(node) in nested:
            child = nested[id(node)]
            kind = "class " if isinstance(child, ast.ClassDef) else "def "
            out.append((child.lineno, child.col_offset, kind + child.name))
            continue
        line, col = getattr(node, "lineno", None), getattr(node, "col_offset", 0)
        if line is None:
            if not isinstance(node, (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)):
                stack.extend(ast.iter_child_nodes(node))
            continue
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                out.append((line, col, dotted))
                continue
        if isinstance(node, (ast.BoolOp, ast.Compare)):
            # Each operator where its right operand starts, not all at the expression's start.
            ops = (
                [type(node.op).__name__.lower()] * (len(node.values) - 1)
                if isinstance(node, ast.BoolOp)
                else [type(op).__name__ for op in node.ops]
            )
            rights = node.values[1:] if isinstance(node, ast.BoolOp) else node.comparators
            out.extend((r.lineno, r.col_offset - 1, op) for op, r in zip(ops, rights))
        else:
            for token in _leaf(node):
                out.append((line, col, token))
        stack.extend(ast.iter_child_nodes(node))
    out.sort()
    return [(token, line) for line, _, token in out]


# -- the check ------------------------------------------------------------------------


def _parse(source: bytes) -> Optional[ast.Module]:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def lost(pristine: Optional[bytes], before: bytes, after: bytes, after_tree: Optional[ast.Module] = None) -> list[Lost]:
    """Vendor tokens of ``before`` (beyond ``pristine``) that ``after`` no
    longer has. Nothing when there is no pristine to compare with, or
    ``before`` is the pristine file. ``after_tree``: ``after`` already parsed."""
    if pristine is None or before == pristine or before == after:
        return []
    b_tree = _parse(before)
    a_tree = after_tree or _parse(after)
    if b_tree is None or a_tree is None:
        return []
    b_lines, a_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    b_scopes, a_scopes = scopes(b_tree), scopes(a_tree)
    p_scopes: Optional[dict[str, Scope]] = None
    p_lines: list[bytes] = []
    out: list[Lost] = []
    for name, (b_node, b_children) in b_scopes.items():
        a_node, a_children = a_scopes.get(name, (None, []))
        b_text = own_text(b_lines, b_node, b_children)
        if a_node is not None and b_text == own_text(a_lines, a_node, a_children):
            continue  # untouched by the transform
        if p_scopes is None:  # parsed only when the transform changed a scope
            p_tree = _parse(pristine) if pristine else ast.Module(body=[], type_ignores=[])
            if p_tree is None:
                return []
            p_scopes, p_lines = scopes(p_tree), pristine.splitlines(keepends=True)
        p_node, p_children = p_scopes.get(name, (None, []))
        if p_node is not None and b_text == own_text(p_lines, p_node, p_children):
            continue  # the release's own code: nothing of the vendor's in it
        b_tokens = tokens(b_node, b_children)
        a_tokens = tokens(a_node, a_children) if a_node is not None else []
        p_tokens = tokens(p_node, p_children) if p_node is not None else []
        removed = _inserted(a_tokens, b_tokens)
        if not removed:
            continue
        counts = Counter(t for t, _ in p_tokens), Counter(t for t, _ in b_tokens), Counter(t for t, _ in a_tokens)
        for i in sorted(_vendor(p_tokens, b_tokens, removed, counts)):
            token, line = b_tokens[i]
            out.append(Lost(line, token, name, b_lines[line - 1].decode("utf-8", "replace").strip()))
    return out


def _opcodes(base: list[Token], new: list[Token]):
    return difflib.SequenceMatcher(None, [t for t, _ in base], [t for t, _ in new], autojunk=False).get_opcodes()


def _inserted(base: list[Token], new: list[Token]) -> set[int]:
    """Indexes of ``new``'s tokens that aligning it with ``base`` finds no
    counterpart for."""
    found: set[int] = set()
    for tag, _, _, j1, j2 in _opcodes(base, new):
        if tag in ("insert", "replace"):
            found.update(range(j1, j2))
    return found


def _vendor(
    pristine: list[Token], before: list[Token], removed: set[int], counts: tuple[Counter, Counter, Counter]
) -> set[int]:
    """Indexes of the vendor's tokens in ``before`` that the transform lost.

    The vendor's code comes in blocks (what aligning ``before`` with the
    release finds inserted or replaced). A block is lost by what makes it the
    vendor's: its tokens the release's scope lacks, where it has some (an
    ``or isinstance(s, Vendor)`` merged into ``isinstance(s, (..., Vendor))``
    keeps ``Vendor``: nothing is lost); else all of it. A token the result
    still has as often as before was moved, not lost. An insertion next to
    equal tokens (``a, x, a`` after ``a``) can be placed several ways: the
    placement the transform least removes is taken."""
    p_count, b_count, a_count = counts
    keys = [t for t, _ in before]

    def gone(block: range) -> set[int]:
        own = [i for i in block if p_count[keys[i]] == 0]
        hit = {i for i in (own or block) if i in removed and a_count[keys[i]] < b_count[keys[i]]}
        return hit if own or len(hit) == len(block) else set()

    out: set[int] = set()
    for tag, _, _, j1, j2 in _opcodes(pristine, before):
        if tag == "replace":
            out |= gone(range(j1, j2))
        elif tag == "insert":
            best = None
            lo, hi = j1, j2
            while lo > 0 and keys[lo - 1] == keys[hi - 1]:
                lo, hi = lo - 1, hi - 1
            while True:
                hit = gone(range(lo, hi))
                if best is None or len(hit) < len(best):
                    best = hit
                if hi >= len(keys) or keys[lo] != keys[hi] or not best:
                    break
                lo, hi = lo + 1, hi + 1
            out |= best
    return out


class VendorCodeLost(PatchkitError):
    """A patch would remove code the vendor added: the site is refused (exit
    1, like a patch that cannot apply), nothing is changed."""

    exit_code = EXIT_CHANGES

    def __init__(self, site: str, patch: Optional[str]) -> None:
        from patchkit.registry import skip_advice

        skip = skip_advice(patch) if patch else "`--skip` that patch (the other patches still apply)"
        # What the maintainer can do, said in the same line as the refusal.
        self.remedy = f"keep that code out of the patch's site, carry the change by hand there, or {skip}"
        super().__init__(f"{site}; nothing was changed: {self.remedy}")
        self.site, self.patch = site, patch  # the refusal without its consequence; the refused patch (None: unknown)


def check(
    path: Path,
    before: bytes,
    pristine: bytes,
    after: bytes,
    after_tree: ast.Module,
    original: "cst.Module",
    instances: Sequence["PatchCodemod"],
    transformed: Sequence[str],
    owners: Mapping[str, str] = MappingProxyType({}),
) -> list[str]:
    """The vendor-code rule for one transformed file: nothing lost, or every
    loss declared by the codemod that made it (``REPLACES_VENDOR``): one note
    line each. Anything else raises :class:`VendorCodeLost` naming file:line,
    the vendor's code and the codemod (and its patch: ``owners``, codemod
    name -> patch id, handed down by whoever chose the codemods)."""
    found = lost(pristine, before, after, after_tree)
    if not found:
        return []
    blame = _blame(pristine, before, original, instances, transformed, found)
    notes: dict[tuple, str] = {}
    refused = []
    for item in found:
        inst = blame.get(item)
        why = _declared(inst, item) if inst is not None else None
        who = f"{inst.name()} (patch {owners.get(inst.name(), '?')})" if inst is not None else "the import block edit"
        if why is None:
            refused.append((item, who))
        else:  # one line per line of code and codemod, however many of its tokens go
            notes.setdefault(
                (item.line, who), f"{path}:{item.line}: {who} replaces the vendor's {describe(item)} on purpose: {why}"
            )
    if refused:
        item, who = refused[0]
        more = f" (and {len(refused) - 1} more vendor token(s))" if len(refused) > 1 else ""
        inst = blame.get(item)
        raise VendorCodeLost(
            f"refused: {path}:{item.line}: {who} would remove code the vendor added, {describe(item)}{more}",
            owners.get(inst.name()) if inst is not None else None,
        )
    return list(notes.values())


def _blame(
    pristine: bytes,
    before: bytes,
    original: "cst.Module",
    instances: Sequence["PatchCodemod"],
    transformed: Sequence[str],
    found: list[Lost],
) -> dict[Lost, "PatchCodemod"]:
    """Which codemod removed each lost token: the transforms again, one at a
    time (only when something was lost)."""
    out: dict[Lost, "PatchCodemod"] = {}
    module = original
    left = set(found)
    for inst in instances:
        if inst.name() not in transformed or not left:
            continue
        module = inst.transform_module(module)
        gone = set(lost(pristine, before, module.bytes)) & left
        for item in gone:
            out[item] = inst
        left -= gone
    return out


def _declared(inst: "PatchCodemod", item: Lost) -> Optional[str]:
    for pattern, why in getattr(inst, "REPLACES_VENDOR", ()):
        if re.fullmatch(pattern, item.token) or re.search(pattern, item.code):
            return why
    return None


def describe(item: Lost) -> str:
    code = item.code if len(item.code) <= 80 else item.code[:77] + "..."
    return f"`{code}` ({item.token} in {item.scope})"
