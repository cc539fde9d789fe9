"""FlashInfer's (MHA) spec-v2 draft extend in a CUDA graph (upstream: sglang 0.5.14).

0.5.10 .. 0.5.12.post1's ``EagleDraftWorker`` captures the draft-extend CUDA
graph only for the backends in its graph check (Triton, TRT-LLM MLA), and
``FlashInferAttnBackend`` has no ``DRAFT_EXTEND_V2`` graph metadata (its
capture raises on that mode): FlashInfer's draft extend runs eagerly every
step. 0.5.14 lists the class and gives the backend a capture and a replay
branch for the mode, the replay planned without host copies
(``fast_prefill_plan``). Three codemods:

* ``speculative/eagle_worker_v2.py`` (``GraphCheckAdmitsFlashInfer``): right
  after the graph check, FlashInfer is let in as FA3 is by
  fa3-draft-extend-graph (CUDA only, no FR-Spec token map), and only where the
  runtime admits it (``admits_flashinfer_draft_extend``: the switch
  ``PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1``, one wrapper). 0.5.8.post1 and
  0.5.9: a flag of our own, one more term of the inline capture gate.
* ``layers/attention/flashinfer_backend.py``: the capture
  (``CapturesDraftExtendV2``) and the replay (``ReplaysDraftExtendV2``) each
  gain, first thing, a ``DRAFT_EXTEND_V2`` branch calling the runtime
  (``backends.flashinfer_draft_extend_graph``), which returns. The capture
  hands it the classes the release's own target-verify capture uses (the
  paged prefill wrapper and the prefill metadata, under whatever names the
  module binds them).

Done: a worker check naming ``FlashInferAttnBackend`` (0.5.14+'s tuple or
list) or calling the admission; a backend method with a ``DRAFT_EXTEND_V2``
branch of its own that stores / reads ``self.draft_extend_cuda_graph_metadata``
(a vendor's: left as it is). 0.5.14+ (no replay method: capture and replay
share one body) with that branch: native. 0.5.13: not carried (no replay
method and no such branch), in one line.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.draft_extend_gate import (
    GRAPH_CHECK,
    NO_TOKEN_MAP,
    AdmitsOnCudaWithoutTokenMap,
    admit,
    graph_check,
)
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

PATCH = "flashinfer-draft-extend-graph"
BACKEND = "FlashInferAttnBackend"
HELPERS = import_path("backends.flashinfer_draft_extend_graph")
ADMIT = "admits_flashinfer_draft_extend"
SWITCH = "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH"
NOT_CARRIED = (
    "not carried onto 0.5.13.x: FlashInfer's capture and replay share one body there "
    "(init_forward_metadata_replay_cuda_graph is gone) and it has no DRAFT_EXTEND_V2 graph branch; "
    "0.5.14 adds both upstream"
)

# -- speculative/eagle_worker_v2.py ---------------------------------------------------------

_FI = m.Name(BACKEND)
_LISTED = (
    m.Call(
        func=m.Name("isinstance"),
        args=[
            m.DoNotCare(),
            m.Arg(value=_FI | m.Tuple(elements=[m.ZeroOrMore(), m.Element(value=_FI), m.ZeroOrMore()])),
        ],
    )
    | m.List(elements=[m.ZeroOrMore(), m.Element(value=_FI), m.ZeroOrMore()])
    | m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg(value=_FI)])
    | m.Call(func=m.Name(ADMIT))
)

_COMMENT = f"""# patchkit {PATCH} (upstream 0.5.14): FlashInfer captures
# its DRAFT_EXTEND_V2 metadata and replays it planned from the CPU mirror.
# Off unless {SWITCH}=1 (no GPU comparison yet);
# CUDA only; eager with an FR-Spec token map (the graph's logits buffer)."""

LET_FI_IN = f"""
if (
    _is_cuda
    and not {GRAPH_CHECK}
    and {NO_TOKEN_MAP}
):
    {_COMMENT.replace(chr(10), chr(10) + "    ")}
    {GRAPH_CHECK} = {ADMIT}(
        self.draft_extend_attn_backend
    )
"""

INLINE_FLAG = "flashinfer_draft_extend_graph"
LET_FI_IN_GATE = f"""
{_COMMENT}
{INLINE_FLAG} = (
    _is_cuda
    and {NO_TOKEN_MAP}
    and {ADMIT}(self.draft_extend_attn_backend)
)
"""


class GraphCheckAdmitsFlashInfer(AdmitsOnCudaWithoutTokenMap):
    DESCRIPTION = (
        f"EagleDraftWorker: the draft-extend CUDA-graph check ({GRAPH_CHECK}, or the capture gate before 0.5.10) "
        f"admits {BACKEND} on CUDA (without a speculative token map) when {SWITCH}=1"
    )
    ADMITTED = BACKEND

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if primitives.contains(fn, _LISTED):
            return Finding.done(anchor)
        gap = self.admission_missing(fn)
        if gap is not None:
            return gap
        if graph_check(fn) is None:
            return self.inline_todo(fn, f"{BACKEND} is not in the draft-extend capture gate")
        return Finding.todo(anchor, f"{BACKEND} is not in the draft-extend graph check")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, ADMIT)
        return admit(fn, LET_FI_IN, LET_FI_IN_GATE, INLINE_FLAG)


# -- layers/attention/flashinfer_backend.py ---------------------------------------------------

_V2_TEST = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend_v2"))) | m.Call(
    func=m.Attribute(attr=m.Name("is_draft_extend")),
    args=[m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))],
)
_METADATA = m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.Name("draft_extend_cuda_graph_metadata")))
_STORES = m.Assign(targets=[m.ZeroOrMore(), m.AssignTarget(target=_METADATA), m.ZeroOrMore()])
_READS = _METADATA
_FORWARD_METADATA = m.Attribute(value=m.Name("self"), attr=m.Name("forward_metadata"))
_GRAPH_WRAPPER = m.Call(args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("qo_indptr_buf")), m.ZeroOrMore()])


def _v2_branches(node: cst.CSTNode) -> list[cst.If]:
    return [b for b in primitives.find_all_of(cst.If, node, m.If()) if primitives.contains(b.test, _V2_TEST)]


def _own_branch(node: cst.CSTNode, does: m.BaseMatcherNode) -> Optional[cst.If]:
    """A ``DRAFT_EXTEND_V2`` branch of ``node`` whose body ``does`` (upstream's, a vendor's)."""
    return next((b for b in _v2_branches(node) if primitives.contains(b.body, does)), None)


def _calls(fn: cst.FunctionDef, helper: str) -> bool:
    return primitives.contains(fn, m.Call(func=m.Name(helper)))


class _DraftExtendV2Branch(MethodCodemod):
    """A ``DRAFT_EXTEND_V2`` branch put first in a CUDA-graph metadata method of
    the backend: it calls HELPER (the runtime) with PARAMS and returns."""

    CLASS = BACKEND
    HELPER = ""
    PARAMS: tuple[str, ...] = ()
    DOES: m.BaseMatcherNode = _STORES  # what a branch of the tree's own does (done)
    WORDS_READ = ("is_draft_extend", "draft_extend_cuda_graph_metadata")  # detect_absent

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        """0.5.14+: capture and replay share one body with the branch (native); 0.5.13: not carried."""
        own = _own_branch(cls, self.DOES)
        if own is not None:
            return Finding.done(f"{self.CLASS}: DRAFT_EXTEND_V2 CUDA-graph metadata (upstream's)")
        return Finding.superseded(self.anchor, NOT_CARRIED, moots_patch=True)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if _calls(fn, self.HELPER):
            return Finding.done(anchor)
        own = _own_branch(fn, self.DOES)
        if own is not None:
            return self.vendors_own(anchor, "handles DRAFT_EXTEND_V2 in a CUDA graph", own)
        names = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
        lacking = [p for p in (*self.PARAMS, "forward_mode") if p not in names]
        if lacking:
            return self.missing_in(
                fn, f"it takes no parameter {lacking[0]}", "the runner's keyword arguments (bs, seq_lens, ...)"
            )
        return self.missing_here(fn) or Finding.todo(anchor, "DRAFT_EXTEND_V2 has no CUDA-graph branch")

    def missing_here(self, fn: cst.FunctionDef) -> Optional[Finding]:
        return None

    def call_source(self, fn: cst.FunctionDef) -> str:
        raise NotImplementedError

    COMMENT = ""

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, self.HELPER)
        comment = "".join(f"    # {line}\n" for line in self.COMMENT.splitlines())
        source = f"if forward_mode.is_draft_extend_v2():\n{comment}    {self.call_source(fn)}\n    return\n"
        body = primitives.block_statements(fn.body)
        index = 1 if body and _is_docstring(body[0]) else 0
        body[index:index] = primitives.parse_statements_with_comments(source)
        return fn.with_changes(body=fn.body.with_changes(body=body))


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]))


class CapturesDraftExtendV2(_DraftExtendV2Branch):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_capture_cuda_graph: DRAFT_EXTEND_V2 is captured as a causal paged "
        "prefill at the graph's fixed query width (capture_draft_extend_v2), its replay plan made sync-free"
    )
    METHOD = "init_forward_metadata_capture_cuda_graph"
    HELPER = "capture_draft_extend_v2"
    PARAMS = ("bs", "num_tokens", "req_pool_indices", "seq_lens", "encoder_lens")
    DOES = _STORES
    COMMENT = (
        f"patchkit {PATCH} (upstream 0.5.14): the spec-v2 draft\n"
        "extend as a causal paged prefill at the graph's fixed query width; its\n"
        "replay plans from the CPU mirror without reading the device back."
    )

    def classes(self, fn: cst.FunctionDef) -> Optional[tuple[str, str]]:
        """The paged prefill wrapper class and the metadata class the release's own
        graph prefill branch uses (a branch building a wrapper on ``qo_indptr_buf``
        and setting ``self.forward_metadata``), as this module names them."""
        for branch in primitives.find_all_of(cst.If, fn, m.If()):
            wrappers = primitives.find_all_of(cst.Call, branch.body, _GRAPH_WRAPPER)
            metas = [
                a.value
                for a in primitives.find_all_of(cst.Assign, branch.body, m.Assign(value=m.Call()))
                if any(m.matches(t.target, _FORWARD_METADATA) for t in a.targets)
            ]
            if wrappers and metas:
                return code_of(wrappers[0].func), code_of(cst.ensure_type(metas[0], cst.Call).func)
        return None

    def missing_here(self, fn: cst.FunctionDef) -> Optional[Finding]:
        if self.classes(fn) is None:
            return self.missing_in(
                fn,
                "no CUDA-graph prefill branch builds a wrapper on qo_indptr_buf= and sets self.forward_metadata",
                "one to take the paged prefill wrapper and metadata classes from",
            )
        return None

    def call_source(self, fn: cst.FunctionDef) -> str:
        found = self.classes(fn)
        assert found is not None  # detect found them
        wrapper, metadata = found
        return (
            f"self.forward_metadata = {self.HELPER}(\n"
            "        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens,\n"
            f"        {wrapper}, {metadata},\n"
            "    )"
        )


class ReplaysDraftExtendV2(_DraftExtendV2Branch):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_replay_cuda_graph: DRAFT_EXTEND_V2 re-plans the captured wrappers "
        "from the CPU mirror (replay_draft_extend_v2; the stock plan where the mirror does not match)"
    )
    METHOD = "init_forward_metadata_replay_cuda_graph"
    HELPER = "replay_draft_extend_v2"
    PARAMS = ("bs", "req_pool_indices", "seq_lens", "seq_lens_sum", "encoder_lens", "seq_lens_cpu")
    DOES = _READS
    COMMENT = (
        f"patchkit {PATCH} (upstream 0.5.14): the draft-extend\n"
        "graph's plan from the CPU mirror (the stock plan where it does not match)."
    )

    def call_source(self, fn: cst.FunctionDef) -> str:
        return (
            f"{self.HELPER}(\n"
            "        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, seq_lens_cpu\n"
            "    )"
        )
