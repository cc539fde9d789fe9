"""How ``forward_extend``'s fixed-q kernel call is read and rewritten, for
``ForwardExtendFixedQDraftExtend``: found by meaning, not by spelling (the
call however imported, its ``cache_seqlens`` by keyword or position, followed
through the locals it was computed in, casts and ``+`` either way round), and
the terms that hand DRAFT_EXTEND_V2 to the FlashInfer MLA parent.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.primitives import attr, call

IS_DRAFT_EXTEND_V2 = m.Call(func=attr("is_draft_extend_v2"))

# What forward_extend's fixed-q kernel call is handed, found by meaning: the
# call (``flash_mla_with_kvcache``, however imported), its cache_seqlens
# (keyword or fourth positional argument), followed through the locals it was
# computed in, casts and ``+`` in either order.

FIXED_Q_KERNEL = "flash_mla_with_kvcache"
CACHE_SEQLENS = "cache_seqlens"
CACHE_SEQLENS_POSITION = 3  # flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, ...)
KERNEL_CALL = m.Call(func=m.Name(FIXED_Q_KERNEL) | attr(FIXED_Q_KERNEL))
DRAFT_EXTEND_V2_MODE = attr("DRAFT_EXTEND_V2", m.Name("ForwardMode"))
DRAFT_EXTEND_V2_TEST = IS_DRAFT_EXTEND_V2 | DRAFT_EXTEND_V2_MODE
SUPER_CALL = m.Call(func=attr("forward_extend", m.Call(func=m.Name("super"))))
CASTS = "to|int|long|type|contiguous"  # `.to(torch.int32)`, `.to(device)`, `.int()`, ...
DRAFT_TOKENS = attr("num_draft_tokens|speculative_num_draft_tokens")
OURS = call("fixed_q_cache_seqlens")
UPSTREAM_K_LENS = attr("seq_lens_k")


def strip_casts(node: cst.BaseExpression) -> cst.BaseExpression:
    """``X.to(...)`` / ``X.int()`` / ``torch.as_tensor(X, ...)`` -> X (the value, not its dtype or device)."""
    while True:
        if m.matches(node, m.Call(func=attr(CASTS))):
            node = node.func.value
        elif m.matches(node, m.Call(func=m.Name("int") | call("torch.as_tensor").func, args=[m.Arg(keyword=None), m.ZeroOrMore()])):
            node = node.args[0].value
        else:
            return node


class Locals:
    """The assignments of one method, by the local name they bind."""

    def __init__(self, fn: cst.FunctionDef) -> None:
        self.fn = fn
        self.defs: dict[str, list[cst.CSTNode]] = {}
        for assign in primitives.find_all(fn, m.Assign(targets=[m.AssignTarget(target=m.Name())]) | m.AnnAssign(target=m.Name(), value=m.DoNotCare())):
            target = assign.targets[0].target if isinstance(assign, cst.Assign) else assign.target
            if assign.value is not None:
                self.defs.setdefault(target.value, []).append(assign)

    def values(self, node: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        """The expressions ``node`` stands for: itself, or every value a local it names is assigned."""
        if isinstance(node, cst.Name) and node.value in self.defs and depth < 4:
            return [v for d in self.defs[node.value] for v in self.values(d.value, depth + 1)]
        return [node]

    def one(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """``node`` through locals assigned once, and casts."""
        for _ in range(5):
            node = strip_casts(node)
            values = self.values(node) if isinstance(node, cst.Name) else [node]
            if len(values) != 1 or values[0] is node:
                return node
            node = values[0]
        return node


def verify_lengths(node: cst.BaseExpression, local: Locals) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(the batch, the draft-token count as written) when ``node`` computes the
    verify lengths ``<batch>.seq_lens + <num_draft_tokens>``, in any spelling."""
    node = strip_casts(node)
    if m.matches(node, m.BinaryOperation(operator=m.Add())):
        operands = (node.left, node.right)
    elif m.matches(node, m.Call(func=call("torch.add").func, args=[m.Arg(keyword=None), m.Arg(keyword=None)])):
        operands = (node.args[0].value, node.args[1].value)
    else:
        return None
    for lengths, draft in (operands, operands[::-1]):
        seq_lens = local.one(lengths)
        if m.matches(seq_lens, attr("seq_lens")) and m.matches(local.one(draft), DRAFT_TOKENS):
            return seq_lens.value, draft
    return None


def cache_seqlens(kernel: cst.Call) -> Optional[cst.Arg]:
    keyword = next((a for a in kernel.args if m.matches(a, m.Arg(keyword=m.Name(CACHE_SEQLENS)))), None)
    if keyword is not None:
        return keyword
    positional = [a for a in kernel.args if a.keyword is None and not a.star]
    return positional[CACHE_SEQLENS_POSITION] if len(positional) > CACHE_SEQLENS_POSITION else None


def mode_split(fn: cst.FunctionDef, value: cst.BaseExpression, local: Locals) -> Optional[cst.CSTNode]:
    """Where this value already differs for the draft extend: a conditional
    expression on the mode, or a local assigned apart under ``if <draft extend v2>``
    (and elsewhere too). That node, or None."""
    for candidate in [value, *local.values(value)]:
        if m.matches(candidate, m.IfExp(test=m.MatchIfTrue(lambda t: primitives.contains(t, DRAFT_EXTEND_V2_TEST)))):
            return candidate
    if not isinstance(value, cst.Name) or len(local.defs.get(value.value, ())) < 2:
        return None
    defs = local.defs[value.value]
    for branch in primitives.find_all(fn, m.If(test=m.MatchIfTrue(lambda t: primitives.contains(t, DRAFT_EXTEND_V2_TEST)))):
        for side in (branch.body, branch.orelse):
            held = {id(n) for n in primitives.find_all(side, m.Assign() | m.AnnAssign())} if side is not None else set()
            inside = [d for d in defs if id(d) in held]
            if inside and len(inside) < len(defs):
                return inside[0]
    return None


def routed_terms(fn: cst.FunctionDef) -> list[cst.CSTNode]:
    """The terms that hand DRAFT_EXTEND_V2 to the FlashInfer MLA parent: in the
    test of an ``if`` whose body calls ``super().forward_extend``, an element
    ``ForwardMode.DRAFT_EXTEND_V2`` of a tuple/list/set, or an ``or`` operand
    that tests for it (``== ForwardMode.DRAFT_EXTEND_V2``, ``.is_draft_extend_v2()``)."""
    terms: list[cst.CSTNode] = []
    for branch in primitives.find_all(fn, m.If()):
        if not primitives.contains(branch.body, SUPER_CALL):
            continue
        for element in primitives.find_all(branch.test, m.Element(value=DRAFT_EXTEND_V2_MODE)):
            terms.append(element)
        for chain in primitives.find_all(branch.test, m.BooleanOperation(operator=m.Or())):
            for side in (chain.left, chain.right):
                if not isinstance(side, cst.BooleanOperation) and (
                    m.matches(side, IS_DRAFT_EXTEND_V2)
                    or m.matches(side, m.Comparison(comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=DRAFT_EXTEND_V2_MODE)]))
                ):
                    terms.append(side)
    return terms


class ByIdentity(cst.CSTTransformer):
    """Replace nodes found by a search (by identity) with new ones, and drop
    the ``drops`` terms from the tuples and ``or`` chains that hold them."""

    def __init__(self, new: Optional[dict[int, cst.CSTNode]] = None, drops: frozenset = frozenset()) -> None:
        self.new, self.drops = new or {}, drops

    def on_leave(self, original, updated):
        if id(original) in self.new:
            return self.new[id(original)]
        if self.drops and _holds_drop(original, self.drops):
            return _drop_terms(original, updated, self.drops)
        return updated


def _holds_drop(node: cst.CSTNode, drops: set[int]) -> bool:
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return any(id(e) in drops for e in node.elements)
    if isinstance(node, cst.BooleanOperation):
        return id(node.left) in drops or id(node.right) in drops
    return False


def _drop_terms(original: cst.CSTNode, updated: cst.CSTNode, drops: set[int]) -> cst.CSTNode:
    if isinstance(original, cst.BooleanOperation):
        kept = updated.right if id(original.left) in drops else updated.left
        return kept.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else kept
    kept: list[cst.Element] = []
    last = len(original.elements) - 1
    for i, (element, new) in enumerate(zip(original.elements, updated.elements)):
        if id(element) not in drops:
            kept.append(new)
        elif kept and i == last:
            # The element before takes the dropped one's comma (and the line
            # break before the closing parenthesis): one element left with its
            # comma is still a tuple.
            kept[-1] = kept[-1].with_changes(comma=new.comma)
    return updated.with_changes(elements=kept)
