"""FlashMLA (``FlashMLABackend``, DeepSeek MLA on Hopper) opts out of the spec-v2 seq_lens D2H sync.

Upstream: sglang #31090 (device-side fixed-q draft extend, preallocated
verify tree mask, static block-table bounds when the mirror is absent,
``needs_cpu_seq_lens = False`` on the backend and its multi-step draft
wrapper). SPEC.md's table of later changes says 0.5.17; the 0.5.16 wheel
already has all of it, so 0.5.16+ is native (0.5.17 only replaced the tree
mask with the ``verify_mask`` property: those parts are superseded there).

What FlashMLA read from the CPU mirror, and what it reads now (helpers in
``patchkit.backends.mirror_reads`` and ``.flashmla``, each exactly the old
value when the mirror is there):

* eager ``init_forward_metadata``: the mirror's max sized the block table
  gathered from ``req_to_token`` (decode; verify: the mirror plus the draft
  tokens) -> the static bound ``max_context_len`` (+ the draft tokens) without
  it; the kernel stops every row at the device ``cache_seqlens``.
* CUDA-graph replay (``init_forward_metadata_replay_cuda_graph``; 0.5.13+
  ``_apply_decode_target_verify_metadata``): the decode branch asserted the
  mirror; the slice, the verify shift and the max cope with None. 0.5.13 ..
  0.5.15 fell back to ``seq_lens.max().item()`` (a sync of its own) without
  the mirror: the static bound instead. The width only slices the
  preallocated table, which the fill kernel writes up to each row's length.
* the draft extend (``DRAFT_EXTEND_V2``): a new eager branch builds FlashMLA
  metadata from device lengths (``draft_extend_seq_lens_k``) and
  ``forward_extend`` runs it on the fixed-q kernel with those K lengths
  (``fixed_q_cache_seqlens``). Before, 0.5.13 .. 0.5.15 handed it to the
  FlashInfer MLA parent (a host-planned prefill that reads the mirror and the
  host length lists), and 0.5.10 .. 0.5.12.post1 let it reach the fixed-q
  kernel with the parent's metadata and the verify lengths.
* the verify tree mask: FA3's codemods (``fa3_spec_v2``), on this class.

Not carried: upstream's draft-extend CUDA graph for FlashMLA (the eager draft
extend above is already sync-free) and its reused eager block-table scratch
(the table is allocated per step, as before).
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import primitives
from patchkit.codemods.base import Finding, Guard, MethodCodemod
from patchkit.codemods.primitives import attr, call, plus, save
from patchkit.codemods.replay_no_stale_mirror import MIRROR_READS, code_of, none_comparison
from patchkit.vendoring import import_path

BACKEND = "FlashMLABackend"
DRAFT_BACKEND = "FlashMLAMultiStepDraftBackend"
HELPERS = import_path("backends.flashmla")  # the fixed-q draft extend
LOCAL_MIRROR = m.Name("seq_lens_cpu")
BATCH_MIRROR = attr("seq_lens_cpu", m.Name("forward_batch"))


# -- the flags -----------------------------------------------------------------------------


class BackendOptsOut(fa3.OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{fa3.FLAG} = False: no FlashMLA read of seq_lens_cpu / seq_lens_sum is left on the spec-v2 paths"
    CLASS = BACKEND
    WHY = (
        "Block tables use a static width without the CPU mirror, the draft extend\n"
        "runs on the fixed-q kernel from device lengths and the verify tree mask\n"
        "is preallocated, so no seq_lens_cpu / seq_lens_sum D2H is needed."
    )


class DraftWrapperOptsOut(fa3.OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{fa3.FLAG} = False: the draft steps are FlashMLA backends that opt out"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Read by decide_needs_cpu_seq_lens (a missing flag counts as True); the\n"
        "per-step FlashMLA backends never read the CPU mirror."
    )


# -- the reads of the mirror --------------------------------------------------------------

BOUND = "self.max_context_len"
VERIFY_BOUND = "self.max_context_len + self.num_draft_tokens"


class EagerMetadataWithoutMirror(fa3.MirrorReadGuards):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: block-table width from the mirror or the static "
        "max_context_len (+ draft tokens for verify)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"
    GUARDS = (
        # decode: `triton.cdiv(forward_batch.seq_lens_cpu.max().item(), PAGE_SIZE)`
        Guard(fa3.max_item(save(BATCH_MIRROR, "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
        # verify: `seq_lens_cpu = forward_batch.seq_lens_cpu + self.num_draft_tokens`, then its max
        Guard(plus(BATCH_MIRROR), "plus_or_none(LEFT, RIGHT)", "plus_or_none"),
        Guard(fa3.max_item(save(LOCAL_MIRROR, "M")), f"host_max_seq_len(M, {VERIFY_BOUND})", "host_max_seq_len"),
    )


REPLAY_ASSERT = m.Assert(test=none_comparison(save(LOCAL_MIRROR, "M"), m.IsNot()))


class ReplayMetadataWithoutMirror(fa3.MirrorReadGuards):
    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay metadata: seq_lens_cpu may be None (no assert, no "
        "seq_lens.max() sync); block-table width from the mirror or the static max_context_len"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_decode_target_verify_metadata",)  # 0.5.13+
    GUARDS = (
        # 0.5.10 .. 0.5.12.post1, decode: the mirror was required.
        Guard(REPLAY_ASSERT, "assert M is None or len(M) >= bs"),
        # verify: `seq_lens_cpu[:bs] + self.num_draft_tokens` (before the slice is rewritten)
        Guard(plus(fa3.first_rows(LOCAL_MIRROR, "N")), "plus_or_none(LEFT, RIGHT)", "plus_or_none"),
        fa3.REPLAY_GUARDS[0],  # seq_lens_cpu[:bs] -> rows_or_none
        # 0.5.13 .. 0.5.15: `seq_lens_cpu.max().item() if seq_lens_cpu is not None
        # else seq_lens.max().item()`, a D2H of its own without the mirror.
        Guard(
            m.IfExp(
                test=none_comparison(LOCAL_MIRROR, m.IsNot()),
                body=fa3.max_item(save(LOCAL_MIRROR, "M")),
                orelse=fa3.max_item(m.Name("seq_lens")),
            ),
            f"host_max_seq_len(M, {BOUND})",
            "host_max_seq_len",
        ),
        Guard(fa3.max_item(save(LOCAL_MIRROR, "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
    )


# -- the fixed-q draft extend -------------------------------------------------------------

IS_DRAFT_EXTEND_V2 = m.Call(func=attr("is_draft_extend_v2"))
IS_TARGET_VERIFY = m.Call(func=attr("is_target_verify"))
KV_INDICES_WRITER = "create_flashmla_kv_indices_triton"
WRITER_LAUNCH = m.Subscript(value=m.Name(KV_INDICES_WRITER))


class EagerDraftExtendMetadata(MethodCodemod):
    """A ``DRAFT_EXTEND_V2`` branch after target verify in the eager metadata:
    FlashMLA metadata from the device lengths, launched like the decode
    branch's block-table writer (its grid changed in 0.5.13)."""

    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: DRAFT_EXTEND_V2 builds fixed-q FlashMLA metadata from device "
        "lengths (draft_extend_seq_lens_k) instead of the FlashInfer MLA parent's host-planned prefill"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"

    def _verify_branches(self, fn: cst.FunctionDef) -> list[cst.If]:
        return primitives.find_all(fn, m.If(test=IS_TARGET_VERIFY, orelse=m.Else()))

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, m.If(test=IS_DRAFT_EXTEND_V2)):
            return Finding.done(self.anchor)
        if len(self._verify_branches(fn)) != 1:
            return self.missing_in(fn, "no `elif ...is_target_verify(): ... else: ...` chain", "one to add the draft-extend branch after")
        if not primitives.find_all(fn, WRITER_LAUNCH):
            return self.missing_in(fn, f"no {KV_INDICES_WRITER}[...](...) launch", "one to launch the draft-extend block table like")
        return Finding.todo(self.anchor, "DRAFT_EXTEND_V2 goes to the FlashInfer MLA parent")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        grid = code_of(primitives.find_all(fn, WRITER_LAUNCH)[0].slice[0].slice.value)
        branch = primitives.parse_statement(f"""
if forward_batch.forward_mode.is_draft_extend_v2():
    # Spec v2's draft extend: every request extends by the same window of
    # draft tokens, so it runs on the fixed-q FlashMLA kernel from device
    # lengths (FlashInfer MLA's prefill plan reads the CPU mirror).
    window = self.num_draft_tokens
    seq_lens_k = draft_extend_seq_lens_k(forward_batch.seq_lens, forward_batch.extend_seq_lens, window)
    max_seqlen_pad = triton.cdiv(
        host_max_seq_len(forward_batch.seq_lens_cpu, {BOUND}) + window, PAGE_SIZE
    )
    block_kv_indices = torch.full(
        (bs, max_seqlen_pad), -1, dtype=torch.int32, device=forward_batch.seq_lens.device
    )
    {KV_INDICES_WRITER}[{grid}](
        self.req_to_token,
        forward_batch.req_pool_indices,
        seq_lens_k,
        None,
        block_kv_indices,
        self.req_to_token.stride(0),
        max_seqlen_pad,
    )
    mla_metadata, num_splits = get_mla_metadata(
        seq_lens_k, window * self.num_q_heads, 1, is_fp8_kvcache=self.is_fp8_kvcache
    )
    self.forward_metadata = FlashMLADecodeMetadata(mla_metadata, num_splits, block_kv_indices)
    # The kernel's K lengths, read by forward_extend (fixed_q_cache_seqlens).
    self.forward_metadata.seq_lens_k = seq_lens_k
""")
        self.require_import(HELPERS, "draft_extend_seq_lens_k")
        self.require_import(MIRROR_READS, "host_max_seq_len")
        verify = self._verify_branches(fn)[0]
        elif_branch = branch.with_changes(orelse=verify.orelse)
        return m.replace(
            fn, m.MatchIfTrue(lambda node: node is verify), lambda old, _: old.with_changes(orelse=elif_branch)
        )


SUPER_ROUTED_DRAFT_EXTEND_V2 = m.Element(value=m.Attribute(value=m.Name("ForwardMode"), attr=m.Name("DRAFT_EXTEND_V2")))
VERIFY_CACHE_SEQLENS = m.BinaryOperation(
    left=m.Call(func=attr("to", attr("seq_lens", m.Name("forward_batch")))),
    operator=m.Add(),
    right=attr("num_draft_tokens", m.Name("self")),
)


class ForwardExtendFixedQDraftExtend(MethodCodemod):
    """``forward_extend`` runs DRAFT_EXTEND_V2 on the fixed-q kernel with the
    metadata's K lengths: no longer handed to the parent (0.5.13 .. 0.5.15
    list it beside EXTEND), and ``cache_seqlens`` from ``fixed_q_cache_seqlens``
    (the verify lengths, seq_lens + draft tokens, stay as they were)."""

    DESCRIPTION = (
        f"{BACKEND}.forward_extend: DRAFT_EXTEND_V2 on the fixed-q kernel with the draft extend's K lengths "
        "(fixed_q_cache_seqlens), not the FlashInfer MLA parent"
    )
    CLASS = BACKEND
    METHOD = "forward_extend"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, attr("seq_lens_k")):
            return Finding.done(self.anchor, "upstream's own draft-extend K lengths (0.5.16+)")
        routed = primitives.find_all(fn, SUPER_ROUTED_DRAFT_EXTEND_V2)
        shifted = primitives.find_all(fn, VERIFY_CACHE_SEQLENS)
        if not routed and not shifted:
            if primitives.contains(fn, call("fixed_q_cache_seqlens")):
                return Finding.done(self.anchor)
            return self.missing_in(fn, "no `forward_batch.seq_lens.to(...) + self.num_draft_tokens` here", "the fixed-q kernel's cache_seqlens to rewrite")
        if not shifted:
            return self.missing_in(fn, "DRAFT_EXTEND_V2 is routed to the parent, but no fixed-q cache_seqlens", "both")
        return Finding.todo(self.anchor, f"{len(shifted)} fixed-q cache_seqlens without the draft extend's K lengths")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if primitives.contains(fn, SUPER_ROUTED_DRAFT_EXTEND_V2):
            fn = m.replace(fn, m.Tuple(elements=[m.ZeroOrMore(), SUPER_ROUTED_DRAFT_EXTEND_V2, m.ZeroOrMore()]), _drop_draft_extend_v2)
        self.require_import(HELPERS, "fixed_q_cache_seqlens")
        return primitives.rewrite_expressions(
            fn, VERIFY_CACHE_SEQLENS, "fixed_q_cache_seqlens(forward_batch, self.forward_metadata, self.num_draft_tokens)"
        )


def _drop_draft_extend_v2(old: cst.Tuple, _) -> cst.Tuple:
    kept: list[cst.Element] = []
    for element in old.elements:
        if not m.matches(element, SUPER_ROUTED_DRAFT_EXTEND_V2):
            kept.append(element)
        elif kept and element is old.elements[-1]:
            # The element before takes the dropped one's comma (and the line
            # break before the closing parenthesis): one element left with its
            # comma is still a tuple.
            kept[-1] = kept[-1].with_changes(comma=element.comma)
    return old.with_changes(elements=kept)


# -- the verify tree mask (FA3's codemods, on FlashMLA) ------------------------------------


class InitTreeMask(fa3.InitTreeMask):
    DESCRIPTION = f"{BACKEND}.__init__: self.{fa3.MASK} = None and self.is_draft_runner (draft-worker instances never verify)"
    CLASS = BACKEND
    KIND = "FlashMLA"


class AllocTreeMask(fa3.AllocTreeMask):
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{fa3.MASK} (bool, max_num_tokens * "
        "(max_context_len + num_draft_tokens)) on the target backend only"
    )
    CLASS = BACKEND
    NUM_DRAFT_TOKENS: ClassVar[str] = "self.num_draft_tokens"


class VerifyBuffersReturnTreeMask(fa3.VerifyBuffersReturnTreeMask):
    DESCRIPTION = f"{BACKEND}.{fa3.GET_BUFFERS} returns [self.{fa3.MASK}, None]"
    CLASS = BACKEND
