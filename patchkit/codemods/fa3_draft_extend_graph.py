"""FA3's spec-v2 draft extend in a CUDA graph (upstream: sglang 0.5.23).

``EagleDraftWorker`` captures the draft-extend CUDA graph only for the
backends in its graph check (``supports_cuda_draft_extend_graph``): Triton and
TRT-LLM MLA on 0.5.10 .. 0.5.12.post1, a longer tuple or list later.
``FlashAttentionBackend``, Hopper's default, is not in it, although its
capture and replay metadata already have ``DRAFT_EXTEND_V2`` branches: every
draft extend on FA3 runs eagerly. 0.5.23 appends the class to the list.

Two codemods:

* ``speculative/eagle_worker_v2.py``: right after the graph check is computed,
  whatever its form (an ``or`` chain, an isinstance tuple, a list that is
  appended to), FA3 is let in: on CUDA only, imported there (as upstream: MUSA
  and NPU builds must not import sgl_kernel), and not with an FR-Spec token
  map (``speculative_token_map`` on EAGLE / STANDALONE, whose reduced head the
  graph runner of these releases does not size its logits buffer for;
  FlashInfer's #28782 fell back to eager the same way). EAGLE3 drafts with a
  reduced draft vocab (a ``d2t`` map, so ``hot_token_id`` is set) are
  captured: the runner sizes that buffer from ``draft_vocab_size``. The
  vendor's expression is left as it is: nothing of theirs is rebuilt. A
  worker patched by an earlier patchkit (eager whenever ``hot_token_id`` is
  set, so for most published EAGLE3 checkpoints) is brought to this form.
* ``layers/attention/flashattention_backend.py``: nothing is changed; the
  release's FA3 must have both graph branches (capture: an
  ``is_draft_extend_v2`` / ``is_draft_extend(include_v2=True)`` branch that
  stores ``self.draft_extend_metadata[bs]``; replay: one that reads it), else
  the patch is refused with one line naming the missing branch.

0.5.8.post1 and 0.5.9 test the backends inline, in the ``if`` that captures
the graph: a flag computed the same way, then one more term of that ``if``'s
``or``. 0.5.4 .. 0.5.7 replay no CUDA draft-extend graph on spec v2 (see
``common.draft_extend_gate``): not applicable there, with why.

Done: a tree whose graph check already names ``FlashAttentionBackend``
(0.5.23's list, ours, a vendor's own).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCheck, Finding
from patchkit.codemods.common.draft_extend_gate import (
    GRAPH_CHECK,
    NO_TOKEN_MAP,
    AdmitsOnCudaWithoutTokenMap,
    admit,
    graph_check,
)
from patchkit.codemods.common.shared import code_of

FA3 = "FlashAttentionBackend"
FA3_MODULE = "sglang.srt.layers.attention.flashattention_backend"

# FA3 named where a graph check lists classes: isinstance(x, FA3), isinstance(x, (..., FA3)),
# [..., FA3] or .append(FA3).
_FA3 = m.Name(FA3)
_IN_TUPLE = m.Tuple(elements=[m.ZeroOrMore(), m.Element(value=_FA3), m.ZeroOrMore()])
FA3_LISTED = (
    m.Call(func=m.Name("isinstance"), args=[m.DoNotCare(), m.Arg(value=_FA3 | _IN_TUPLE)])
    | m.List(elements=[m.ZeroOrMore(), m.Element(value=_FA3), m.ZeroOrMore()])
    | m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg(value=_FA3)])
)

#: Who is let in: no FR-Spec token map (EAGLE3 ignores one; its d2t draft vocab is sized).
ADMITS = NO_TOKEN_MAP
#: What an earlier patchkit wrote: eager whenever hot_token_id is set, EAGLE3's d2t too.
EARLIER_TEST = f"_is_cuda and not {GRAPH_CHECK} and self.hot_token_id is None"

LET_FA3_IN = f"""
if (
    _is_cuda
    and not {GRAPH_CHECK}
    and {ADMITS}
):
    # patchkit fa3-draft-extend-graph (upstream 0.5.23): FA3 has CUDA-graph
    # metadata for DRAFT_EXTEND_V2 (capture and replay), so its draft extend is
    # captured too. CUDA only, imported here: MUSA and NPU builds must not
    # import sgl_kernel. Eager with an FR-Spec token map: the graph's logits
    # buffer is not sized for its reduced head (EAGLE3's draft vocab is).
    from {FA3_MODULE} import (
        {FA3},
    )

    {GRAPH_CHECK} = isinstance(
        self.draft_extend_attn_backend, {FA3}
    )
"""

#: 0.5.4 .. 0.5.9 have no named check: a flag of our own, one more term of the capture gate.
INLINE_FLAG = "fa3_draft_extend_graph"
LET_FA3_IN_GATE = f"""
# patchkit fa3-draft-extend-graph (upstream 0.5.23): FA3 has CUDA-graph
# metadata for DRAFT_EXTEND_V2 (capture and replay), so its draft extend is
# captured too. CUDA only, imported here: MUSA and NPU builds must not
# import sgl_kernel. Eager with an FR-Spec token map: the graph's logits
# buffer is not sized for its reduced head (EAGLE3's draft vocab is).
{INLINE_FLAG} = False
if (
    _is_cuda
    and {ADMITS}
):
    from {FA3_MODULE} import (
        {FA3},
    )

    {INLINE_FLAG} = isinstance(
        self.draft_extend_attn_backend, {FA3}
    )
"""


class GraphCheckAdmitsFA3(AdmitsOnCudaWithoutTokenMap):
    DESCRIPTION = (
        f"EagleDraftWorker: the draft-extend CUDA-graph check ({GRAPH_CHECK}) admits {FA3} on CUDA "
        "(without a speculative token map), imported where it is used"
    )
    ADMITTED = FA3

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        earlier = _earlier_form(fn)
        if earlier is not None:
            return self.located(
                Finding.todo(anchor, "an earlier patchkit's check: EAGLE3 drafts with a d2t map stay eager"), earlier
            )
        if primitives.contains(fn, FA3_LISTED):
            return Finding.done(anchor)
        gap = self.admission_missing(fn)
        if gap is not None:
            return gap
        if graph_check(fn) is None:
            return self.inline_todo(fn, f"{FA3} is not in the draft-extend capture gate")
        return Finding.todo(anchor, f"{FA3} is not in the draft-extend graph check")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if _earlier_form(fn) is not None:
            return primitives.replace_statements(fn, _EARLIER, _this_form)
        return admit(fn, LET_FA3_IN, LET_FA3_IN_GATE, INLINE_FLAG)


_EARLIER = m.If(test=m.MatchIfTrue(lambda test: code_of(test) == EARLIER_TEST))


def _earlier_form(fn: cst.FunctionDef) -> "cst.If | None":
    found = primitives.find_all_of(cst.If, fn, _EARLIER)
    return found[0] if found else None


def _this_form(stmt: cst.If) -> cst.If:
    """The earlier If with this test and comment; its body (the import and
    the assignment) is the same."""
    new = cst.ensure_type(primitives.parse_statements_with_comments(LET_FA3_IN)[0], cst.If)
    body = primitives.block_statements(stmt.body)
    return stmt.with_changes(
        test=new.test,
        body=stmt.body.with_changes(
            body=[body[0].with_changes(leading_lines=primitives.block_statements(new.body)[0].leading_lines), *body[1:]]
        ),
    )


# --- flashattention_backend.py: the graph branches the patch relies on ------------------

_V2_TEST = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend_v2"))) | m.Call(
    func=m.Attribute(attr=m.Name("is_draft_extend")),
    args=[m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))],
)
_DRAFT_EXTEND_METADATA = m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.Name("draft_extend_metadata")))
_STORES = m.Assign(targets=[m.ZeroOrMore(), m.AssignTarget(target=_DRAFT_EXTEND_METADATA), m.ZeroOrMore()])
_READS = m.Assign(value=_DRAFT_EXTEND_METADATA)


def _v2_branches(cls: cst.ClassDef) -> list[cst.If]:
    return [b for b in primitives.find_all_of(cst.If, cls, m.If()) if primitives.contains(b.test, _V2_TEST)]


class FA3HasDraftExtendGraphBranches(ClassCheck):
    DESCRIPTION = (
        f"{FA3} has DRAFT_EXTEND_V2 CUDA-graph metadata: a capture branch that stores "
        "self.draft_extend_metadata[bs] and a replay branch that reads it (checked, not changed)"
    )
    CLASS = FA3
    METHODS_READ, WORDS_READ = (), ("is_draft_extend",)  # the branches' tests

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{FA3}: DRAFT_EXTEND_V2 CUDA-graph branches"
        branches = _v2_branches(cls)
        capture = any(primitives.contains(b.body, _STORES) for b in branches)
        replay = any(primitives.contains(b.body, _READS) for b in branches)
        for present, kind, shape in (
            (capture, "capture", "stores self.draft_extend_metadata[bs]"),
            (replay, "replay", "reads metadata = self.draft_extend_metadata[bs]"),
        ):
            if not present:
                return self.located(
                    Finding.missing(
                        anchor,
                        f"{self.where(cls)}: {FA3} has no DRAFT_EXTEND_V2 CUDA-graph {kind} branch "
                        f"(an `if forward_mode.is_draft_extend_v2():` that {shape}); its draft extend cannot be captured",
                    ),
                    branches[0] if branches else None,
                )
        return Finding.superseded(anchor, "both present; nothing to change in this file")
