"""The None tests the audit reads as guards of a mirror read (ast): a test
that holds only when the mirror is there (``x is not None``), or only when it
is not (``x is None``), the decision's own call (``needs_cpu_seq_lens()``),
and blocks that assign a name on every path. ``primitives.NoneGuards``
decides the same for the codemods on libcst's tree."""

from __future__ import annotations

import ast
from typing import Optional

from patchkit.audit.scan import MIRROR


def assigns(block: list, target: str) -> bool:
    """Every path through ``block`` assigns ``target`` something other than None."""
    for stmt in block:
        if (
            isinstance(stmt, ast.Assign)
            and not is_none(stmt.value)
            and any(ast.unparse(t) == target for t in stmt.targets)
        ):
            return True
        if isinstance(stmt, ast.If) and stmt.orelse and assigns(stmt.body, target) and assigns(stmt.orelse, target):
            return True
    return False


def is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def named_mirror(node: ast.AST) -> bool:
    """``x.seq_lens_cpu``, ``seq_lens_cpu``, or ``getattr(x, "seq_lens_cpu", None)``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    ):
        return node.args[1].value in MIRROR
    return (isinstance(node, ast.Attribute) and node.attr in MIRROR) or (
        isinstance(node, ast.Name) and node.id in MIRROR
    )


def none_test(test: ast.AST) -> Optional[bool]:
    """True: ``test`` holds only when a mirror value is not None (``x is not
    None``, alone or in an ``and``); False: only when it is None (``x is
    None``, alone or in an ``or``); None: neither. As
    ``primitives.NoneGuards`` decides for the codemods; this one reads ast."""
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and named_mirror(test.left)
        and is_none(test.comparators[0])
    ):
        if isinstance(test.ops[0], ast.IsNot):
            return True
        if isinstance(test.ops[0], ast.Is):
            return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = none_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        found = [none_test(v) for v in test.values]
        if isinstance(test.op, ast.And) and True in found:
            return True
        if isinstance(test.op, ast.Or) and False in found:
            return False
    return None


def decision_test(test: ast.AST) -> Optional[bool]:
    """True: ``test`` is ``needs_cpu_seq_lens()``; False: ``not needs_cpu_seq_lens()``; None: another test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = decision_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "needs_cpu_seq_lens":
        return True
    return None


def _mode(test: ast.AST) -> Optional[str]:
    """``is_extend`` for ``<...>.forward_mode.is_extend()`` and the like."""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute):
        return test.func.attr
    return None


def prefill_branch(ancestors: list[tuple[ast.AST, ast.AST]]) -> Optional[str]:
    """Why a read (whose ``(parent, child)`` ancestors are given, innermost
    first) runs on prefill batches only, which always carry the mirror: in the
    body of ``if ...is_extend_without_speculative():``, or of an
    ``elif ...is_extend():`` that the chain reaches only once it has tested
    ``is_target_verify()`` and ``is_draft_extend(...)`` (the attention
    backends' mode dispatch: NSA / DSA's ``init_forward_metadata``)."""
    for index, (parent, child) in enumerate(ancestors):
        if not (isinstance(parent, ast.If) and child in parent.body):
            continue
        mode = _mode(parent.test)
        if mode == "is_extend_without_speculative":
            return "prefill branch (is_extend_without_speculative()): prefill batches carry the mirror"
        if mode == "is_extend":
            earlier = {_mode(p.test) for p, c in ancestors[index + 1 :] if isinstance(p, ast.If) and c in p.orelse}
            if "is_target_verify" in earlier and earlier & {"is_draft_extend", "is_draft_extend_v2"}:
                return (
                    "prefill branch (elif is_extend() after the verify and draft-extend branches): the mirror is there"
                )
    return None
