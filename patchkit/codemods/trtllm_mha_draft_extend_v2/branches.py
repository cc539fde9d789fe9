"""Which branch of a TRT-LLM MHA CUDA-graph metadata method is the draft
extend, for ``CaptureIncludesDraftExtendV2`` and ``ReplayDraftExtendV2Stride``:
the mode tests (V1 only, V1 and V2, V2 alone) in an ``if`` of the method or
of a fork's own condition, and V1's run of query-length statements (what the
replay keeps as V1's path when V2 gets its fixed stride).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives

HELPER = "fill_draft_extend_v2_cu_seqlens_q"

IS_DRAFT_EXTEND = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")))
IS_DRAFT_EXTEND_V1_ONLY = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")), args=[])
INCLUDE_V2 = m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))
IS_DRAFT_EXTEND_ANY = m.Call(
    func=m.Attribute(attr=m.Name("is_draft_extend")), args=[m.ZeroOrMore(), INCLUDE_V2, m.ZeroOrMore()]
)
IS_DRAFT_EXTEND_V2 = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend_v2")), args=[])


def testing(call: Union[m.Call, m.OneOf[m.Call]]) -> m.If:
    """An ``if`` / ``elif`` whose test holds ``call``, not negated: the mode
    test alone or in a fork's own condition (``... and self.vendor_flag``)."""
    negated = m.UnaryOperation(operator=m.Not(), expression=call)
    return m.If(test=m.MatchIfTrue(lambda t: primitives.contains(t, call) and not primitives.contains(t, negated)))


def branches(fn: cst.CSTNode, call: Union[m.Call, m.OneOf[m.Call]]) -> list[cst.If]:
    return list(primitives.find_all_of(cst.If, fn, testing(call)))


def draft_extend_method(cls: cst.ClassDef, names: Sequence[str]) -> Optional[cst.FunctionDef]:
    """The first of ``names`` that has a draft-extend branch (a fork may keep
    the old name as a thin wrapper around the new one)."""
    found = [f for f in (primitives.find_method(cls, n) for n in names) if f is not None]
    for fn in found:
        if branches(fn, IS_DRAFT_EXTEND | IS_DRAFT_EXTEND_V2):
            return fn
    return found[0] if found else None


def with_include_v2(if_: cst.If) -> cst.If:
    """The V1-only mode test in the ``if``'s condition, with include_v2=True."""
    test = primitives.replace_expressions(
        if_.test, IS_DRAFT_EXTEND_V1_ONLY, lambda call, _: primitives.set_keyword_argument(call, "include_v2", "True")
    )
    return if_.with_changes(test=test)


# The per-request accepted-token counts V1 reads, by release: 0.5.10 -
# 0.5.10.post1 `accept_length`, 0.5.11 `num_accepted_tokens`, 0.5.12+
# `num_accept_tokens` (each with a `_cpu` host list).
ACCEPT_FIELDS = ("num_accept_tokens", "num_accepted_tokens", "accept_length")
_V1_QUERY_ATTRS = {*ACCEPT_FIELDS, *(f"{f}_cpu" for f in ACCEPT_FIELDS), "max_seq_len_q", "cu_seqlens_q"}


def _touches_v1_query_lens(stmt: cst.BaseStatement) -> bool:
    """A statement of V1's variable-length query path: it reads the accepted
    counts (or their CPU mirror) or writes ``max_seq_len_q`` / ``cu_seqlens_q``."""
    return primitives.contains(stmt, m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v in _V1_QUERY_ATTRS))))


def v1_run(branch: cst.If) -> Optional[tuple[int, int]]:
    """[first, last] indices of the V1 query-length statements in the branch
    body, when they are one uninterrupted run (anything else between them
    would silently change V2 if moved into the V1 ``else``)."""
    body = primitives.block_statements(branch.body)
    hits = [i for i, s in enumerate(body) if _touches_v1_query_lens(s)]
    if not hits or hits != list(range(hits[0], hits[-1] + 1)):
        return None
    if not any(primitives.contains(body[i], m.Attribute(attr=m.Name("cu_seqlens_q"))) for i in hits):
        return None
    return hits[0], hits[-1]


def draft_extend_branch(fn: cst.FunctionDef) -> Optional[cst.If]:
    found = branches(fn, IS_DRAFT_EXTEND)
    return found[0] if found else None


def has_v2_split(branch: cst.If) -> bool:
    return bool(branches(branch.body, IS_DRAFT_EXTEND_V2)) or primitives.contains(
        branch.body, m.Call(func=m.Name(HELPER))
    )
