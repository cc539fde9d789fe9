"""sglang #26521 (0.5.13): TRT-LLM MHA's draft-decode CUDA-graph capture seeds
the lengths its warm-up runs read.

``TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph`` (0.5.10 ..
0.5.12.post1) binds the draft-decode ``metadata.cache_seqlens_int32`` to a
slice of the preallocated ``decode_cuda_graph_metadata["cache_seqlens"]``
buffer, which is zeros until the first replay copies ``seq_lens + step + 1``
into it. The graph runner runs the forward eagerly (warm-up) before and while
capturing with that metadata: the TRT-LLM kernel sees an empty KV range and
some tiles divide 0 by 0, so the draft model's attention output is NaN (an
assertion under ``SGLANG_SPEC_NAN_DETECTION=1``; otherwise NaN hidden states
and KV written for the capture's dummy slots). The fix copies what replay
copies, right after the binding, before anything derived from it
(``cu_seqlens_k``) is computed.

0.5.13 restructured capture (``_build_cuda_graph_metadata`` binds, the shared
capture+replay body ``_apply_cuda_graph_metadata`` binds again and copies):
the method is gone there, and the class's ``init_forward_metadata_out_graph``
(capture and replay share it; 0.5.15+ through an in-graph kernel) makes the
tree native. #26655, the same day, rebinds the
slice before the replay copy in that restructured body; 0.5.10 .. 0.5.12.post1
bind it once at capture and replay copies into that very slice, so it has
nothing to fix there (docs/research/upstream-followups.md).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of, none_comparison

BACKEND = "TRTLLMHAAttnBackend"
LENGTHS = "cache_seqlens_int32"

#: ``M.cache_seqlens_int32 = self.decode_cuda_graph_metadata[...][...]``: bound to the graph buffer.
BINDS_TO_BUFFER = m.Assign(
    targets=[m.AssignTarget(target=attr(LENGTHS))],
    value=m.Subscript(value=m.Subscript(value=attr("decode_cuda_graph_metadata", m.Name("self")))),
)
OUT_GRAPH = "init_forward_metadata_out_graph"
DRAFT_DECODE = m.If(test=none_comparison(m.Name("spec_info"), m.IsNot()))

SEED = """
# patchkit trtllm-mha-draft-decode-capture (sglang #26521): the buffer holds
# zeros until the first replay, and the capture's warm-up runs would attend to
# an empty KV range (NaN). Seed it as replay does.
{receiver}.cache_seqlens_int32.copy_(seq_lens[:bs] + self.speculative_step_id + 1)
"""


def _binding(block: cst.BaseSuite) -> Optional[tuple[int, str]]:
    """The statement of ``block`` that binds the lengths to the graph buffer,
    and the metadata it binds them on."""
    for i, stmt in enumerate(getattr(block, "body", ())):
        if (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and m.matches(stmt.body[0], BINDS_TO_BUFFER)
        ):
            binds = cst.ensure_type(stmt.body[0], cst.Assign)  # <receiver>.<LENGTHS> = ..., as matched
            return i, code_of(cst.ensure_type(binds.targets[0].target, cst.Attribute).value)
    return None


def _seeds(stmts, receiver: str) -> bool:
    """A later statement copies into ``<receiver>.cache_seqlens_int32``."""
    lengths = m.Attribute(value=m.MatchIfTrue(lambda n: code_of(n) == receiver), attr=m.Name(LENGTHS))
    return any(primitives.contains(s, m.Call(func=attr("copy_", lengths))) for s in stmts)


class SeedDraftDecodeLengthsAtCapture(MethodCodemod):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_capture_cuda_graph, draft decode: copy seq_lens + step + 1 into the "
        "cache_seqlens buffer it binds (zeros until the first replay: NaN in the capture's warm-up)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata_capture_cuda_graph"
    METHODS_READ = (OUT_GRAPH,)  # detect_absent

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        # 0.5.13+: capture fills its metadata with the body replay runs
        # (init_forward_metadata_out_graph -> _apply_cuda_graph_metadata; from
        # 0.5.15 an in-graph kernel), which writes the lengths: upstream's own fix.
        if primitives.find_method(cls, OUT_GRAPH) is not None:
            return Finding.done(self.anchor, f"upstream's {OUT_GRAPH} fills the capture's lengths as replay does")
        return super().detect_absent(cls)

    def _branches(self, fn: cst.FunctionDef) -> list[tuple[cst.If, int, str]]:
        found = []
        for branch in primitives.find_all_of(cst.If, fn, DRAFT_DECODE):
            bound = _binding(branch.body)
            if bound is not None:
                found.append((branch, *bound))
        return found

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        branches = self._branches(fn)
        if not branches:
            return self.missing_in(
                fn,
                "no `if spec_info is not None:` branch binding cache_seqlens_int32 to the decode graph buffer",
                "the draft-decode capture branch to seed its lengths",
            )
        if all(_seeds(branch.body.body[i + 1 :], receiver) for branch, i, receiver in branches):
            return Finding.done(self.anchor_of(fn))
        return Finding.todo(self.anchor_of(fn), "the draft-decode capture leaves cache_seqlens at zero")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        for branch, i, receiver in self._branches(fn):
            if _seeds(branch.body.body[i + 1 :], receiver):
                continue
            body = list(branch.body.body)
            body[i + 1 : i + 1] = primitives.parse_statements_with_comments(SEED.format(receiver=receiver))
            new_body = branch.body.with_changes(body=body)
            fn = primitives.replace_node(fn, branch.body, new_body)
        return fn
