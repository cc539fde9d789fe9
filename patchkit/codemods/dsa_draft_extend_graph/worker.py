"""Patch dsa-draft-extend-graph's change to the spec-v2 worker: its draft-extend
CUDA-graph check lets DeepSeek sparse attention in (sglang #29413), on CUDA,
without an FR-Spec token map.

0.5.10 .. 0.5.12.post1 name the check (``supports_cuda_draft_extend_graph``):
the backend is let in right after it. 0.5.8 .. 0.5.9 hold it inline in the
``if`` that captures the graph (an ``or`` of ``_is_cuda and isinstance(...)``
terms): a flag of the patch's own is set before that ``if`` and becomes one
more term (as fa3-draft-extend-graph does there). 0.5.7 captures the graph on
NPU only: not applicable (``DraftExtendGraphCheck``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding
from patchkit.codemods.common.draft_extend_gate import (
    GRAPH_CHECK,
    NO_TOKEN_MAP,
    AdmitsOnCudaWithoutTokenMap,
    admit,
    graph_check,
)
from patchkit.codemods.common.dsa import DSA, NSA
from patchkit.layout import import_path

ID = "dsa-draft-extend-graph"
_NAMED = m.Name(NSA) | m.Name(DSA) | m.Call(func=m.Name("is_dsa_backend"))

LET_DSA_IN = f"""
if (
    _is_cuda
    and not {GRAPH_CHECK}
    and {NO_TOKEN_MAP}
):
    # patchkit {ID} (sglang #29413): DeepSeek sparse
    # attention replays its spec-v2 draft extend at a fixed query width, so it
    # is captured too. CUDA only (its kernels are); eager with an FR-Spec token
    # map, whose reduced head the graph's logits buffer is not sized for.
    {GRAPH_CHECK} = is_dsa_backend(
        self.draft_extend_attn_backend
    )
"""

#: 0.5.8 .. 0.5.9 have no named check: a flag of our own, one more term of the capture gate.
INLINE_FLAG = "dsa_draft_extend_graph"
LET_DSA_IN_GATE = f"""
# patchkit {ID} (sglang #29413): DeepSeek sparse
# attention replays its spec-v2 draft extend at a fixed query width, so it
# is captured too. CUDA only (its kernels are); eager with an FR-Spec token
# map, whose reduced head the graph's logits buffer is not sized for.
{INLINE_FLAG} = (
    _is_cuda
    and {NO_TOKEN_MAP}
    and is_dsa_backend(self.draft_extend_attn_backend)
)
"""


class GraphCheckAdmitsDsa(AdmitsOnCudaWithoutTokenMap):
    DESCRIPTION = (
        f"EagleDraftWorker: the draft-extend CUDA-graph check ({GRAPH_CHECK}, or the capture gate before 0.5.10) "
        f"admits {NSA} / {DSA} on CUDA (without a speculative token map)"
    )
    ADMITTED = "DeepSeek sparse attention"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if primitives.contains(fn, _NAMED):
            return Finding.done(anchor)
        gap = self.admission_missing(fn)
        if gap is not None:
            return gap
        if graph_check(fn) is None:
            return self.inline_todo(fn, "DeepSeek sparse attention is not in the draft-extend capture gate")
        return Finding.todo(anchor, "DeepSeek sparse attention is not in the draft-extend graph check")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(import_path("backends.dsa_graph"), "is_dsa_backend")
        return admit(fn, LET_DSA_IN, LET_DSA_IN_GATE, INLINE_FLAG)
