"""FA3 (``FlashAttentionBackend``) opts out of the spec-v2 seq_lens D2H sync.

Upstream: sglang #29343 (sync-free page table: built on the device over a
static width), #29589 (preallocated FULL_MASK tree mask handed to
``build_tree_kernel_efficient``; FA3 opts out for every spec algorithm),
#31364 (the multi-step draft wrapper declares the flag; draft-extend q width
from the config when the host lengths are unset; CUDA-graph replay passes
``None`` instead of a stale pinned ``seq_lens_cpu`` buffer) and #31527 (the
tree mask only on the target backend). All of them are in the sglang 0.5.16
wheel (SPEC.md's table of later changes says 0.5.17), so 0.5.16+ is native.

What FA3 read from the CPU mirror, and what it reads now (helpers in
``patchkit.backends.mirror_reads``, each exactly the old value when the mirror is there):

* eager ``init_forward_metadata``: ``forward_batch.seq_lens_cpu.max().item()``
  sized the page table gathered from ``req_to_token`` -> the static bound
  ``max_context_len`` without the mirror (FA3's kernels stop every row at the
  device ``cache_seqlens``; nothing else reads the value on the spec paths);
  the draft-extend test ``any(extend_prefix_lens_cpu)`` and
  ``max(extend_seq_lens_cpu)`` cope with the unset host lists of the GPU-only
  draft extend (q width = the configured number of draft tokens). 0.5.15
  already had a mirror-or-local-D2H variable: its fallback becomes None and its
  reads bounded the same way.
* CUDA-graph replay (``init_forward_metadata_replay_cuda_graph``, 0.5.13+
  ``_apply_cuda_graph_metadata``): the slice ``seq_lens_cpu[:bs]`` and each
  host max the same way; 0.5.15's local ``_host_max_seq_len`` syncs on the spec
  branches as well; and the page count handed to the fused Triton page-table
  writer (``normal_decode_set_metadata``, which masks only by that count) is
  kept within the preallocated table.
* the replay's page tables (issue 42): the target-verify and draft-extend
  gathers become patchkit's device build, each row up to its ``cache_seqlens``
  (``ReplayPageTableOnDevice``; #29343 / #31381's form), and the fused decode
  writer's kernels stop each row at its live pages (#32109;
  ``DecodePageWriterStopsAtLivePages``, also in ``triton_ops/metadata.py``).
* the verify tree mask: ``__init__`` sets ``cuda_graph_custom_mask = None``
  and records whether this instance is on the draft worker;
  ``init_cuda_graph_state`` allocates the worst case on the target backend;
  ``get_verify_buffers_to_fill_after_draft`` hands it to the worker, so
  ``build_tree_kernel_efficient`` never needs ``seq_lens_sum``.
* ``needs_cpu_seq_lens = False`` on ``FlashAttentionBackend`` (0.5.15's
  dflash-only instance assignment becomes False too) and on
  ``FlashAttentionMultiStepBackend``.

The CUDA-graph runners' stale-buffer fix (#31364's other half) is a patch of
its own, ``replay-no-stale-mirror``, which this one requires: it only matters
once a backend that opts out reads ``seq_lens_cpu`` during replay, and FA3 is
the first that does (Triton and TRT-LLM MLA never read it there);
trtllm-mha-spec-v2 needs it too.

0.5.17 replaced ``cuda_graph_custom_mask`` with a ``verify_mask`` property:
the tree-mask parts are superseded there, never re-added.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding
from patchkit.codemods.common.decode_page_writer import (
    DecodePageWriterStopsAtLivePages as _DecodePageWriterStopsAtLivePages,
)
from patchkit.codemods.common.fa3_tree_mask import (
    AllocTreeMask as _AllocTreeMask,
)
from patchkit.codemods.common.fa3_tree_mask import (
    InitTreeMask as _InitTreeMask,
)
from patchkit.codemods.common.fa3_tree_mask import (
    VerifyBuffersReturnTreeMask as _VerifyBuffersReturnTreeMask,
)
from patchkit.codemods.common.page_table import ReplayPageTableToRealLength
from patchkit.codemods.common.primitives import attr, call
from patchkit.codemods.common.shared import (
    EAGER_DESCRIPTION,
    FLAG,
    MIRROR_READS,
    REPLAY_DESCRIPTION,
    EagerMirrorReads,
    OptOutFlag,
    ReplayMirrorReads,
    code_of,
)
from patchkit.codemods.common.tree_mask import GET_BUFFERS, MASK, MAX_BS

BACKEND = "FlashAttentionBackend"
DRAFT_BACKEND = "FlashAttentionMultiStepBackend"


# -- the flags (common.OptOutFlag) ---------------------------------------------------------


class BackendOptsOut(OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{FLAG} = False: no FA3 read of seq_lens_cpu / seq_lens_sum is left on the spec-v2 paths"
    CLASS = BACKEND
    WHY = (
        "Page tables use a static width without the CPU mirror and the verify tree\n"
        "mask is preallocated, so no seq_lens_cpu / seq_lens_sum D2H is needed."
    )


class DraftWrapperOptsOut(OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: the draft steps are FA3 backends that opt out"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Read by decide_needs_cpu_seq_lens (a missing flag counts as True); the\n"
        "per-step FA3 backends never read the CPU mirror."
    )


# -- the reads of the mirror (common.EagerMirrorReads / ReplayMirrorReads) -------------------


class EagerMetadataWithoutMirror(EagerMirrorReads):
    DESCRIPTION = EAGER_DESCRIPTION.format(BACKEND)
    CLASS = BACKEND


class ReplayMetadataWithoutMirror(ReplayMirrorReads):
    DESCRIPTION = REPLAY_DESCRIPTION.format(BACKEND)
    CLASS = BACKEND


#: ``normal_decode_set_metadata(cache_seqlens, cu_seqlens_k, page_table, req_to_token,
#: req_pool_indices, strided_indices, max_seq_pages, ...)`` (0.5.10 .. 0.5.14): the fused
#: Triton page-table writer of the decode and draft-decode replay.
PAGE_WRITER = "normal_decode_set_metadata"
PAGES_ARG, TABLE_ARG = 6, 2
#: A page count that cannot pass the table: ours, or upstream's static width
#: (0.5.15+ pass ``self.max_num_pages``, wherever the signature puts it).
BOUNDED_PAGES = call("pages_within") | attr("max_num_pages", m.Name("self"))


class ReplayPageTableFits(ClassCodemod):
    """Every call of the page-table writer in the class passes a bounded page
    count. Upstream later moved the calls (0.5.20: a ``_set_decode_page_metadata``
    helper) and changed the signature (0.5.19: no strided indices), always
    with ``self.max_num_pages``: any bounded argument makes a call done."""

    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay: the page count handed to {PAGE_WRITER} stays within the "
        "preallocated page table (pages_within)"
    )
    CLASS = BACKEND
    METHODS = ("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")
    METHODS_READ, WORDS_READ = METHODS, (PAGE_WRITER,)

    @staticmethod
    def _writes(node: cst.CSTNode) -> list[cst.Call]:
        return primitives.find_all_of(cst.Call, node, m.Call(func=m.Name(PAGE_WRITER)))

    @staticmethod
    def _bounded(write: cst.Call) -> bool:
        return any(m.matches(arg.value, BOUNDED_PAGES) for arg in write.args)

    @staticmethod
    def _fixable(write: cst.Call) -> bool:
        # The old signature, the page count a local name computed from the host max
        # (under a vendor's cast too: `int(max_seq_pages)`; primitives.spelled).
        pages = primitives.spelled(m.Name(), slices=False)
        return len(write.args) > PAGES_ARG and m.matches(write.args[PAGES_ARG], m.Arg(keyword=None, value=pages))

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        return self.located(self._detect_in_class(cls), primitives.find_method(cls, self.METHODS[0]))

    def _detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{self.METHODS[0]}"
        writes = self._writes(cls)
        if not writes:
            return Finding.missing(anchor, f"no {PAGE_WRITER}(...) call in the class")
        left = [w for w in writes if not self._bounded(w)]
        if not left:
            return Finding.done(anchor)
        if not all(self._fixable(w) for w in left):
            return Finding.missing(anchor, f"a {PAGE_WRITER}(...) call of an unknown signature")
        return Finding.todo(anchor, f"{len(left)} {PAGE_WRITER} call(s) with an unbounded page count")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        def bound(node: cst.Call, _) -> cst.Call:
            if self._bounded(node) or not self._fixable(node):
                return node
            args = list(node.args)
            pages, table = args[PAGES_ARG], args[TABLE_ARG]
            value = primitives.parse_expression(f"pages_within({code_of(pages.value)}, {code_of(table.value)})")
            args[PAGES_ARG] = pages.with_changes(value=value)
            return node.with_changes(args=args)

        def edit(fn: cst.FunctionDef) -> cst.FunctionDef:
            return primitives.replace_expressions(fn, m.Call(func=m.Name(PAGE_WRITER)), bound)

        self.require_import(MIRROR_READS, "pages_within")
        for fn in list(primitives.methods(cls)):
            if any(not self._bounded(w) for w in self._writes(fn)):
                cls = primitives.replace_method(cls, fn.name.value, edit)
        return cls


# -- the verify tree mask (common's, on FA3) ------------------------------------------------


class InitTreeMask(_InitTreeMask):
    DESCRIPTION = (
        f"{BACKEND}.__init__: self.{MASK} = None and self.is_draft_runner (draft-worker instances never verify)"
    )
    CLASS = BACKEND
    KIND = "FA3"


class AllocTreeMask(_AllocTreeMask):
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} on the target backend only: FULL_MASK "
        "(bool, max_num_tokens * (max_context_len + num_draft_tokens)) with topk > 1, else the compact "
        "QLEN_ONLY layout (max_num_tokens * num_draft_tokens; FA3 reads no mask then, sglang #32886, #32920); "
        f"records the captured max_bs (self.{MAX_BS}) it fits"
    )
    CLASS = BACKEND
    READS_MASK = "self.topk > 1"
    READS_MASK_WHY = "FA3's verify reads the tree mask only with topk > 1 (sglang #32886, #32920)."


class VerifyBuffersReturnTreeMask(_VerifyBuffersReturnTreeMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND


# -- the replay's page table on the device (common's, on FA3) -------------------------------


class ReplayPageTableOnDevice(ReplayPageTableToRealLength):
    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay: the target-verify and draft-extend page tables are built on the "
        "device, each row up to its cache_seqlens (backends.page_table.fill_page_table_rows), not "
        "gathered as wide as the static bound"
    )
    CLASS = BACKEND
    MODES = ("is_target_verify", "is_draft_extend", "is_draft_extend_v2")
    # Upstream's own form (0.5.16+) builds the verify tables on the device and
    # keeps the draft-extend gather: no verify gather left is done.
    DETECT_MODES = ("is_target_verify",)
    PATCH = "fa3-spec-v2"
    UPSTREAM = "sglang #29343, #31381"


# -- the draft-decode page writer (common's, sglang #32109) ---------------------------------


class DecodePageWriterStopsAtLivePages(_DecodePageWriterStopsAtLivePages):
    DESCRIPTION = (
        "normal_decode_set_metadata's Triton kernels (FA3's decode and draft-decode replay) write each "
        "page-table row only up to its live pages (seq_len + delta), not max_seq_pages columns for every row"
    )
    PATCH = "fa3-spec-v2"
    # The codemod runs on two files; REQUIRED_TEXT would turn the file that lacks the kernels into
    # "missing" before detect could say where they are.
    REQUIRED_TEXT = ()


class FA3DecodePageWriterStopsAtLivePages(DecodePageWriterStopsAtLivePages):
    """The kernels in FA3's own module (0.5.10 .. 0.5.12.post1)."""

    ELSEWHERE = "the writer's kernels are not in this module (0.5.13+: triton_ops/metadata.py, the target beside)"
