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
* the verify tree mask: FA3's codemods (``fa3_tree_mask.InitTreeMask`` ..., as ``fa3_spec_v2``), on this class.

Not carried: upstream's draft-extend CUDA graph for FlashMLA (the eager draft
extend above is already sync-free) and its reused eager block-table scratch
(the table is allocated per step, as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import fa3_tree_mask, primitives, shared
from patchkit.codemods.common.base import Finding, MethodCodemod, State
from patchkit.codemods.common.method_guards import Guard
from patchkit.codemods.common.primitives import attr, save
from patchkit.codemods.common.shared import FLAG, MIRROR_READS, code_of, none_comparison
from patchkit.codemods.common.tree_mask import GET_BUFFERS, MASK, MAX_BS
from patchkit.codemods.flashmla_spec_v2.fixed_q import (
    CACHE_SEQLENS,
    FIXED_Q_KERNEL,
    IS_DRAFT_EXTEND_V2,
    KERNEL_CALL,
    OURS,
    UPSTREAM_K_LENS,
    ByIdentity,
    Locals,
    cache_seqlens,
    mode_split,
    routed_terms,
    verify_lengths,
)
from patchkit.layout import import_path

BACKEND = "FlashMLABackend"
DRAFT_BACKEND = "FlashMLAMultiStepDraftBackend"
HELPERS = import_path("backends.flashmla")  # the fixed-q draft extend
LOCAL_MIRROR = m.Name("seq_lens_cpu")
BATCH_MIRROR = attr("seq_lens_cpu", m.Name("forward_batch"))


# -- the flags -----------------------------------------------------------------------------


class BackendOptsOut(shared.OptOutFlag):
    DESCRIPTION = (
        f"{BACKEND}.{FLAG} = False: no FlashMLA read of seq_lens_cpu / seq_lens_sum is left on the spec-v2 paths"
    )
    CLASS = BACKEND
    WHY = (
        "Block tables use a static width without the CPU mirror, the draft extend\n"
        "runs on the fixed-q kernel from device lengths and the verify tree mask\n"
        "is preallocated, so no seq_lens_cpu / seq_lens_sum D2H is needed."
    )


class DraftWrapperOptsOut(shared.OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: the draft steps are FlashMLA backends that opt out"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Read by decide_needs_cpu_seq_lens (a missing flag counts as True); the\n"
        "per-step FlashMLA backends never read the CPU mirror."
    )


# -- the reads of the mirror --------------------------------------------------------------

BOUND = "self.max_context_len"
VERIFY_BOUND = "self.max_context_len + self.num_draft_tokens"


class EagerMetadataWithoutMirror(shared.MirrorReadGuards):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: block-table width from the mirror or the static "
        "max_context_len (+ draft tokens for verify)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"
    GUARDS = (
        # decode: `triton.cdiv(forward_batch.seq_lens_cpu.max().item(), PAGE_SIZE)`
        Guard(
            shared.max_item(save(BATCH_MIRROR, "M")), f"host_max_seq_len(M, {BOUND}, forward_batch)", "host_max_seq_len"
        ),
        # verify: `seq_lens_cpu = forward_batch.seq_lens_cpu + self.num_draft_tokens`, then its max
        Guard(primitives.added(BATCH_MIRROR), "plus_or_none(LEFT, RIGHT)", "plus_or_none"),
        Guard(
            shared.max_item(save(LOCAL_MIRROR, "M")),
            f"host_max_seq_len(M, {VERIFY_BOUND}, forward_batch)",
            "host_max_seq_len",
        ),
    )


REPLAY_ASSERT = m.Assert(test=none_comparison(save(LOCAL_MIRROR, "M"), m.IsNot()))


class ReplayMetadataWithoutMirror(shared.MirrorReadGuards):
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
        Guard(primitives.added(shared.first_rows(LOCAL_MIRROR, "N")), "plus_or_none(LEFT, RIGHT)", "plus_or_none"),
        shared.REPLAY_GUARDS[0],  # seq_lens_cpu[:bs] -> rows_or_none
        # 0.5.13 .. 0.5.15: `seq_lens_cpu.max().item() if seq_lens_cpu is not None
        # else seq_lens.max().item()`, a D2H of its own without the mirror.
        Guard(
            m.IfExp(
                test=none_comparison(LOCAL_MIRROR, m.IsNot()),
                body=shared.max_item(save(LOCAL_MIRROR, "M")),
                orelse=shared.max_item(m.Name("seq_lens")),
            ),
            f"host_max_seq_len(M, {BOUND})",
            "host_max_seq_len",
        ),
        Guard(shared.max_item(save(LOCAL_MIRROR, "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
    )


# -- the fixed-q draft extend -------------------------------------------------------------

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
        return primitives.find_all_of(cst.If, fn, m.If(test=IS_TARGET_VERIFY, orelse=m.Else()))

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, m.If(test=IS_DRAFT_EXTEND_V2)):
            return Finding.done(self.anchor)
        if len(self._verify_branches(fn)) != 1:
            return self.missing_in(
                fn, "no `elif ...is_target_verify(): ... else: ...` chain", "one to add the draft-extend branch after"
            )
        if not primitives.find_all(fn, WRITER_LAUNCH):
            return self.missing_in(
                fn, f"no {KV_INDICES_WRITER}[...](...) launch", "one to launch the draft-extend block table like"
            )
        return Finding.todo(self.anchor, "DRAFT_EXTEND_V2 goes to the FlashInfer MLA parent")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        launch = primitives.find_all_of(cst.Subscript, fn, WRITER_LAUNCH)[0]
        grid = code_of(cst.ensure_type(launch.slice[0].slice, cst.Index).value)  # writer[grid]
        branch = primitives.parse_statement(f"""
if forward_batch.forward_mode.is_draft_extend_v2():
    # Spec v2's draft extend: every request extends by the same window of
    # draft tokens, so it runs on the fixed-q FlashMLA kernel from device
    # lengths (FlashInfer MLA's prefill plan reads the CPU mirror).
    window = self.num_draft_tokens
    seq_lens_k = draft_extend_seq_lens_k(forward_batch.seq_lens, forward_batch.extend_seq_lens, window)
    max_seqlen_pad = triton.cdiv(
        host_max_seq_len(forward_batch.seq_lens_cpu, {BOUND}, forward_batch) + window, PAGE_SIZE
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
        return primitives.replace_node(fn, verify, verify.with_changes(orelse=elif_branch))


@dataclass
class _Site:
    kernel: cst.Call
    state: State
    detail: str = ""
    targets: tuple = ()  # (node to rewrite, batch, draft-token count)
    by_tree: bool = False


class ForwardExtendFixedQDraftExtend(MethodCodemod):
    """``forward_extend`` runs DRAFT_EXTEND_V2 on the fixed-q kernel with the
    metadata's K lengths: no longer handed to the parent (0.5.13 .. 0.5.15
    list it beside EXTEND), and each fixed-q kernel call's ``cache_seqlens``
    from ``fixed_q_cache_seqlens`` (the verify lengths, seq_lens + draft
    tokens, stay as they were).

    Found by meaning, per kernel call: the value it is handed (through the
    locals it was computed in, any cast, ``+`` either way round, a local for
    the draft-token count). A call whose value already differs for the draft
    extend (a conditional on the mode) is the tree's own change: done, with a
    note."""

    DESCRIPTION = (
        f"{BACKEND}.forward_extend: DRAFT_EXTEND_V2 on the fixed-q kernel with the draft extend's K lengths "
        "(fixed_q_cache_seqlens), not the FlashInfer MLA parent"
    )
    CLASS = BACKEND
    METHOD = "forward_extend"
    # The vendor's spelling of the verify lengths, and of the parent routing, is what this replaces.
    REPLACES_VENDOR = (
        (
            r"to|int|long|type|contiguous|torch|int32|add|device|dtype|as_tensor|seq_lens|num_draft_tokens|"
            r"speculative_num_draft_tokens|is_draft_extend_v2|forward_mode|ForwardMode|DRAFT_EXTEND_V2",
            "the fixed-q kernel's cache_seqlens in the vendor's spelling becomes fixed_q_cache_seqlens "
            "(the same verify lengths outside the draft extend); DRAFT_EXTEND_V2 no longer goes to the parent",
        ),
    )

    def _sites(self, fn: cst.FunctionDef) -> list[_Site]:
        local = Locals(fn)
        sites = []
        for kernel in primitives.find_all_of(cst.Call, fn, KERNEL_CALL):
            arg = cache_seqlens(kernel)
            if arg is None:
                sites.append(
                    _Site(kernel, State.MISSING, f"`{code_of(kernel.func)}(...)` is handed no {CACHE_SEQLENS}")
                )
                continue
            value = arg.value
            values = local.values(value)
            if any(primitives.contains(v, OURS) for v in [value, *values]):
                sites.append(_Site(kernel, State.DONE))
            elif any(primitives.contains(v, UPSTREAM_K_LENS) for v in [value, *values]):
                sites.append(_Site(kernel, State.DONE, "upstream's own draft-extend K lengths (0.5.16+)"))
            elif (split := mode_split(fn, value, local)) is not None:
                sites.append(
                    _Site(
                        kernel,
                        State.DONE,
                        f"this tree already hands the fixed-q kernel the draft extend's own K lengths at {self.where(split)}; "
                        "patchkit leaves it as it is",
                        by_tree=True,
                    )
                )
            else:
                # Rewrite where the value is computed: the argument, or the
                # local(s) it names (each must be the verify lengths).
                nodes = values if isinstance(value, cst.Name) and value.value in local.defs else [value]
                found = [verify_lengths(v, local) for v in nodes]
                if all(found):
                    sites.append(
                        _Site(kernel, State.TODO, targets=tuple((v, *f) for v, f in zip(nodes, found) if f is not None))
                    )
                else:
                    bad = nodes[found.index(None)]
                    sites.append(
                        _Site(
                            kernel,
                            State.MISSING,
                            f"the fixed-q kernel's {CACHE_SEQLENS} is `{code_of(bad)}`",
                            targets=(bad,),
                        )
                    )
        return sites

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        sites = self._sites(fn)
        routed = routed_terms(fn)
        if not sites:
            return self.missing_in(
                fn, f"no fixed-q kernel call ({FIXED_Q_KERNEL}) here", "the fixed-q kernel's cache_seqlens to rewrite"
            )
        missing = [s for s in sites if s.state is State.MISSING]
        if missing:
            site = missing[0]
            node = site.targets[0] if site.targets else site.kernel
            return self.missing_in(
                fn,
                site.detail,
                "the verify lengths (seq_lens + the draft tokens) there, to hand the draft extend its own K lengths",
                node,
            )
        todo = [s for s in sites if s.state is State.TODO]
        if todo or routed:
            what = [f"{len(todo)} fixed-q {CACHE_SEQLENS} without the draft extend's K lengths"] if todo else []
            what += ["DRAFT_EXTEND_V2 handed to the FlashInfer MLA parent"] if routed else []
            return Finding.todo(self.anchor, "; ".join(what))
        notes = list(dict.fromkeys(s.detail for s in sites if s.detail))
        return Finding.done(self.anchor, "; ".join(notes), by_tree=any(s.by_tree for s in sites))

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        rewrites: dict[int, str] = {}
        for site in self._sites(fn):
            for node, batch, draft, bound in site.targets if site.state is State.TODO else ():
                rows = f"[:{code_of(bound)}]" if bound is not None else ""  # the vendor's batch slice, kept
                rewrites[id(node)] = (
                    f"fixed_q_cache_seqlens({code_of(batch)}, self.forward_metadata, {code_of(draft)}){rows}"
                )
        if rewrites:
            self.require_import(HELPERS, "fixed_q_cache_seqlens")
            fn = primitives.visit_below(
                fn, ByIdentity({k: primitives.parse_expression(v) for k, v in rewrites.items()})
            )
        drops = frozenset(id(t) for t in routed_terms(fn))
        if drops:
            fn = primitives.visit_below(fn, ByIdentity(drops=drops))
        return fn


# -- the verify tree mask (common's, as FA3's, on FlashMLA) ------------------------------------


class InitTreeMask(fa3_tree_mask.InitTreeMask):
    DESCRIPTION = (
        f"{BACKEND}.__init__: self.{MASK} = None and self.is_draft_runner (draft-worker instances never verify)"
    )
    CLASS = BACKEND
    KIND = "FlashMLA"


class AllocTreeMask(fa3_tree_mask.AllocTreeMask):
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} in the compact QLEN_ONLY layout "
        "(bool, max_num_tokens * num_draft_tokens: FlashMLA never reads it, sglang #32920) on the target "
        f"backend only, and records the captured max_bs (self.{MAX_BS}) it fits"
    )
    CLASS = BACKEND
    NUM_DRAFT_TOKENS: ClassVar[str] = "self.num_draft_tokens"
    READS_MASK = "False"
    READS_MASK_WHY = "FlashMLA's verify runs its own kernel and never reads the tree mask (sglang #32920)."


class VerifyBuffersReturnTreeMask(fa3_tree_mask.VerifyBuffersReturnTreeMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND
