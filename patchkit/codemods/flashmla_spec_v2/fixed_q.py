"""How ``forward_extend``'s fixed-q kernel call is read and rewritten, for
``ForwardExtendFixedQDraftExtend``: found by meaning, not by spelling (the
call however imported, its ``cache_seqlens`` by keyword or position, followed
through the locals it was computed in, casts and ``+`` either way round), and
the terms that hand DRAFT_EXTEND_V2 to the FlashInfer MLA parent.
"""

from __future__ import annotations

from collections.abc import Set
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
DRAFT_TOKENS = attr("num_draft_tokens|speculative_num_draft_tokens")
OURS = call("fixed_q_cache_seqlens")
UPSTREAM_K_LENS = attr("seq_lens_k")


# Casts and temporaries: the shared primitives (patchkit.codemods.common.primitives.values).
strip_casts = primitives.strip_casts
Locals = primitives.Locals


def verify_lengths(
    node: cst.BaseExpression, local: Locals
) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression, Optional[cst.BaseExpression]]]:
    """(the batch, the draft-token count as written, the bound of a batch
    slice ``[:n]`` or None) when ``node`` computes the verify lengths
    ``<batch>.seq_lens + <num_draft_tokens>``, in any spelling (``primitives.sum_of``)."""
    found = primitives.sum_of(node, attr("seq_lens"), DRAFT_TOKENS, local)
    # found.first matched attr("seq_lens"): <batch>.seq_lens
    return (cst.ensure_type(found.first, cst.Attribute).value, found.second, found.bound) if found else None


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
    for branch in primitives.find_all_of(
        cst.If, fn, m.If(test=m.MatchIfTrue(lambda t: primitives.contains(t, DRAFT_EXTEND_V2_TEST)))
    ):
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
    for branch in primitives.find_all_of(cst.If, fn, m.If()):
        if not primitives.contains(branch.body, SUPER_CALL):
            continue
        for element in primitives.find_all(branch.test, m.Element(value=DRAFT_EXTEND_V2_MODE)):
            terms.append(element)
        for chain in primitives.find_all_of(cst.BooleanOperation, branch.test, m.BooleanOperation(operator=m.Or())):
            for side in (chain.left, chain.right):
                if not isinstance(side, cst.BooleanOperation) and (
                    m.matches(side, IS_DRAFT_EXTEND_V2)
                    or m.matches(
                        side,
                        m.Comparison(
                            comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=DRAFT_EXTEND_V2_MODE)]
                        ),
                    )
                ):
                    terms.append(side)
    return terms


class ByIdentity(cst.CSTTransformer):
    """Replace nodes found by a search (by identity) with new ones, and drop
    the ``drops`` terms from the tuples and ``or`` chains that hold them."""

    def __init__(self, new: Optional[dict[int, cst.CSTNode]] = None, drops: frozenset[int] = frozenset()) -> None:
        self.new, self.drops = new or {}, drops

    def on_leave(self, original, updated):
        if id(original) in self.new:
            return self.new[id(original)]
        if self.drops and _holds_drop(original, self.drops):
            return _drop_terms(original, updated, self.drops)
        return updated


def _holds_drop(node: cst.CSTNode, drops: Set[int]) -> bool:
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return any(id(e) in drops for e in node.elements)
    if isinstance(node, cst.BooleanOperation):
        return id(node.left) in drops or id(node.right) in drops
    return False


def _drop_terms(original: cst.CSTNode, updated: cst.CSTNode, drops: Set[int]) -> cst.CSTNode:
    if isinstance(original, cst.BooleanOperation) and isinstance(updated, cst.BooleanOperation):
        term = updated.right if id(original.left) in drops else updated.left
        return term.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else term
    sequences = (cst.Tuple, cst.List, cst.Set)
    if not (isinstance(original, sequences) and isinstance(updated, sequences)):  # _holds_drop: one of these
        return updated
    kept: list[cst.BaseElement] = []
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
