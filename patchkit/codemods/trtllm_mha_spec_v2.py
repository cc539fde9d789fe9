"""TRT-LLM MHA (``TRTLLMHAAttnBackend``, the default attention backend on
Blackwell) opts out of the spec-v2 seq_lens D2H sync: sglang #28106, native
from 0.5.14 (the wheel; SPEC.md's table of later changes says 0.5.15).

TRT-LLM MHA's metadata has FA3's shape (the backend was written from it): the
host max of the mirror sized the page table gathered from ``req_to_token``,
in the eager ``init_forward_metadata`` and in CUDA-graph replay
(``init_forward_metadata_replay_cuda_graph``; 0.5.13 ``_apply_cuda_graph_metadata``),
and the draft extend read the host length lists. The kernels get
``max_seq_len=self.max_context_len`` and stop each row at the device
``cache_seqlens``, so the static bound is correct without the mirror: the
guards are FA3's codemods on this class (helpers in
``patchkit.backends.mirror_reads``). Replay's torch gather (as wide as the
static bound without the mirror) becomes patchkit's device build, each row up
to its own ``cache_seqlens`` (``ReplayPageTableOnDevice``, common's
``page_table``; sliding-window tables keep the gather), as upstream's
``_fill_page_table_device`` does from 0.5.14: that method makes a 0.5.14+
tree native here. So does the eager metadata's (``EagerPageTableOnDevice``:
a fresh page table built after the forward-mode branches, each row up to its
``cache_seqlens``, in the place of each branch's token gather and its
striding into pages), as upstream's eager ``init_forward_metadata`` does.

Both ``TRTLLMHAAttnBackend`` and ``TRTLLMHAAttnMultiStepDraftBackend`` declare
``needs_cpu_seq_lens = False``. The verify tree mask is not preallocated:
TRT-LLM MHA runs spec v2 with topk 1 only and never reads the mask, and
without a preallocated one the worker sizes it from a static bound
(needs-cpu-seq-lens' ``tree_mask_seq_lens_sum``), without a sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Optional

import libcst as cst

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.eager_page_table import EagerPageTableToRealLength
from patchkit.codemods.common.page_table import ReplayPageTableToRealLength
from patchkit.codemods.common.shared import (
    EAGER_DESCRIPTION,
    REPLAY_DESCRIPTION,
    EagerMirrorReads,
    OptOutFlag,
    ReplayMirrorReads,
)

BACKEND = "TRTLLMHAAttnBackend"
DRAFT_BACKEND = "TRTLLMHAAttnMultiStepDraftBackend"
#: 0.5.14+: the class builds its page tables on the device (the calls moved
#: between methods from release to release; the method is the stable mark).
DEVICE_PAGE_TABLE = "_fill_page_table_device"


# The mixin's own base is object; to mypy, the MethodCodemod it is mixed into (self.anchor, super()).
if TYPE_CHECKING:
    _Mixin = MethodCodemod
else:
    _Mixin = object


class _DevicePageTable(_Mixin):
    """Mixin: a class with upstream's on-device page-table build is done."""

    METHODS_READ: ClassVar[Optional[tuple[str, ...]]] = (DEVICE_PAGE_TABLE,)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        if primitives.find_method(cls, DEVICE_PAGE_TABLE) is not None:
            return Finding.done(self.anchor, f"upstream's device-side page table ({DEVICE_PAGE_TABLE})")
        return super().detect_in_class(cls)


class BackendOptsOut(OptOutFlag):
    DESCRIPTION = (
        f"{BACKEND}.needs_cpu_seq_lens = False: no read of seq_lens_cpu / seq_lens_sum is left on the spec-v2 paths"
    )
    CLASS = BACKEND
    WHY = (
        "Page tables use a static width without the CPU mirror (the kernels stop\n"
        "at the device cache_seqlens), so no seq_lens_cpu D2H sync is needed."
    )


class DraftWrapperOptsOut(OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.needs_cpu_seq_lens = False: its step backends opt out"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Read by decide_needs_cpu_seq_lens (a missing flag counts as True); the\n"
        "per-step TRT-LLM MHA backends never read the CPU mirror."
    )


# FA3's guards (common's), on TRT-LLM MHA (same reads, same helpers).


class EagerMetadataWithoutMirror(_DevicePageTable, EagerMirrorReads):
    DESCRIPTION = EAGER_DESCRIPTION.format(BACKEND)
    CLASS = BACKEND


class ReplayMetadataWithoutMirror(_DevicePageTable, ReplayMirrorReads):
    DESCRIPTION = REPLAY_DESCRIPTION.format(BACKEND)
    CLASS = BACKEND


class ReplayPageTableOnDevice(_DevicePageTable, ReplayPageTableToRealLength):
    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay: the decode, target-verify and draft-extend page tables are built "
        "on the device, each row up to its cache_seqlens (backends.page_table.fill_page_table_rows), "
        "not gathered as wide as the static bound"
    )
    CLASS = BACKEND
    MODES = ("is_decode_or_idle", "is_target_verify", "is_draft_extend", "is_draft_extend_v2")
    DETECT_MODES = MODES
    PATCH = "trtllm-mha-spec-v2"
    UPSTREAM = "sglang #28106"


class EagerPageTableOnDevice(_DevicePageTable, EagerPageTableToRealLength):
    DESCRIPTION = (
        f"{BACKEND} eager metadata: the page table is built on the device after the forward-mode "
        "branches, each row up to its cache_seqlens (backends.page_table.eager_page_table), not "
        "gathered as wide as the static bound and strided (sliding-window backends keep the gather)"
    )
    CLASS = BACKEND
    PATCH = "trtllm-mha-spec-v2"
    UPSTREAM = "sglang #28106"
