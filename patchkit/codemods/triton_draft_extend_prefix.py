"""sglang #26651 (0.5.13): Triton's captured spec-v2 draft extend reads only the cached prefix.

Spec v2 adds the draft tokens to ``seq_lens`` before the draft extend
(``prepare_for_extend_to_fill_draft_kvcache``), and the draft-extend CUDA
graph runner replays with those lengths. ``TritonAttnBackend``'s replay
built the extend's prefix from them (``kv_indptr = cumsum(seq_lens)`` and
the page-table gather of ``seq_lens`` entries), while the extend kernel also
takes the same tokens as its extend part (their own K and V, causally
masked): every draft-extend query attended to all the new tokens once more,
without the causal mask. The draft's hidden states, and so its next
proposals, were wrong on captured batches only (the eager draft extend
builds its prefix from ``extend_prefix_lens``). Outputs stay the target's
(greedy verify accepts only what the target would emit); the accept length
drops.

As upstream: for ``DRAFT_EXTEND_V2`` the prefix is ``seq_lens -
spec_info.extend_seq_lens_tensor`` (the runner attaches the extend lengths
to the spec input before the replay, in every release that has the branch),
clamped at 0 for the padded rows (their ``seq_lens`` hold the fill value).
V1's ``DRAFT_EXTEND`` passes the prefix alone and keeps its path, as does a
replay without the extend lengths. Only the replay is edited: the capture's
numbers are rewritten by every replay, and upstream's capture path used zero
extend lengths there, the lengths as given.

Edit site: ``TritonAttnBackend.init_forward_metadata_replay_cuda_graph``,
the ``forward_mode.is_draft_extend(include_v2=True)`` branch (0.5.8 ..
0.5.12.post1). 0.5.13+: native (``extend_seq_lens_tensor`` read in the
backend). 0.5.4 .. 0.5.7: the branch serves V1's draft extend only (no V2
draft-extend graph on Triton): not applicable.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr

PATCH = "triton-draft-extend-prefix"
#: The extend lengths the runner attaches: read by upstream's backend (0.5.13+) and by the edit.
EXTEND_LENS = "extend_seq_lens_tensor"
PREFIX = "draft_extend_prefix_lens"

IS_DRAFT_EXTEND = m.Call(func=attr("is_draft_extend"))
WITH_V2 = m.Call(func=attr("is_draft_extend"), args=[m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))])
#: ``kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)``: the prefix's indptr from the lengths.
CUMSUM = m.Call(func=primitives.dotted("torch.cumsum"), args=[m.Arg(m.Name("seq_lens")), m.ZeroOrMore()])
INDPTR_FILL = m.Assign(targets=[m.AssignTarget(m.Subscript(value=m.Name("kv_indptr")))], value=CUMSUM)
GATHER = m.Call(func=m.Subscript(value=m.Name("create_flashinfer_kv_indices_triton")))
#: ``seq_lens`` handed as an argument: to the cumsum and to the gather, the prefix instead.
LENGTHS_ARG = m.Arg(value=m.Name("seq_lens"))

PREFIX_SOURCE = f"""
# patchkit {PATCH} (sglang #26651): spec v2 adds the
# draft tokens to seq_lens before the draft extend, and the extend kernel
# takes them as its extend part: the prefix is the rest (0 on padded rows).
{PREFIX} = seq_lens
if forward_mode.is_draft_extend_v2() and getattr(spec_info, "{EXTEND_LENS}", None) is not None:
    {PREFIX} = torch.clamp(
        seq_lens - spec_info.{EXTEND_LENS}[:bs], min=0
    ).to(seq_lens.dtype)
"""


def _branch(fn: cst.FunctionDef) -> Optional[cst.If]:
    """The one ``elif forward_mode.is_draft_extend(include_v2=True):`` branch."""
    found = primitives.find_all_of(cst.If, fn, m.If(test=WITH_V2))
    return found[0] if len(found) == 1 else None


def _fill(branch: cst.If) -> Optional[tuple[cst.IndentedBlock, int]]:
    """(the branch's block, the index of its ``kv_indptr[...] = torch.cumsum(seq_lens, ...)`` line)."""
    block = cst.ensure_type(branch.body, cst.IndentedBlock)
    body = primitives.block_statements(block)
    hits = [i for i, s in enumerate(body) if m.matches(s, m.SimpleStatementLine(body=[INDPTR_FILL]))]
    return (block, hits[0]) if len(hits) == 1 else None


class TritonDraftExtendReplayReadsThePrefix(MethodCodemod):
    DESCRIPTION = (
        "TritonAttnBackend.init_forward_metadata_replay_cuda_graph: a captured DRAFT_EXTEND_V2 builds its prefix "
        "from seq_lens - extend_seq_lens_tensor (sglang #26651), not from seq_lens, which already hold the extend "
        "tokens the kernel attends to as its extend part"
    )
    CLASS = "TritonAttnBackend"
    METHOD = "init_forward_metadata_replay_cuda_graph"
    #: 0.5.13+ fills the draft extend's buffers here, from the extend lengths (no replay method of its own).
    NATIVE_HELPER = "_update_draft_extend_buffers"
    METHODS_READ = (NATIVE_HELPER,)

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        helper = primitives.find_method(cls, self.NATIVE_HELPER)
        if helper is not None and primitives.contains(helper, m.Attribute(attr=m.Name(EXTEND_LENS))):
            return Finding.done(
                self.anchor, f"upstream's {self.NATIVE_HELPER} (0.5.13+): the prefix without the extend"
            )
        return super().detect_absent(cls)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, m.Attribute(attr=m.Name(EXTEND_LENS))):
            return Finding.done(self.anchor)
        branch = _branch(fn)
        if branch is None:
            if primitives.contains(fn, IS_DRAFT_EXTEND) and not primitives.contains(fn, WITH_V2):
                return Finding.superseded(
                    self.anchor,
                    "the draft-extend branch serves V1 only (no V2 draft-extend graph on Triton before 0.5.8)",
                    moots_patch=True,
                )
            return self.missing_in(
                fn, "no single `forward_mode.is_draft_extend(include_v2=True)` branch", "its prefix to narrow"
            )
        site = _fill(branch)
        if site is None:
            return self.vendors_own(self.anchor, "builds the draft extend's prefix", branch.test)
        return Finding.todo(
            self.anchor, "the captured V2 draft extend's prefix holds the extend tokens: attended twice, unmasked"
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        branch = _branch(fn)
        site = None if branch is None else _fill(branch)
        assert branch is not None and site is not None  # detect found them
        block, index = site
        body = primitives.block_statements(block)
        new_body: list[cst.BaseStatement] = [*body[:index], *primitives.parse_statements_with_comments(PREFIX_SOURCE)]
        for stmt in body[index:]:
            reads_lengths = m.matches(stmt, m.SimpleStatementLine(body=[INDPTR_FILL])) or primitives.contains(
                stmt, GATHER
            )
            if reads_lengths:
                stmt = primitives.replace_expressions(
                    stmt, LENGTHS_ARG, lambda arg, _: arg.with_changes(value=cst.Name(PREFIX))
                )
            new_body.append(stmt)
        return primitives.replace_node(fn, block, block.with_changes(body=new_body))
