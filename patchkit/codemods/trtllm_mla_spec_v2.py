"""sglang #26824: TRT-LLM MLA opts out of the spec-v2 seq_lens D2H sync.

trtllm-gen kernels rebuild their metadata from preallocated buffers and never
read ``seq_lens_cpu`` / ``seq_lens_sum``, so both TRT-LLM MLA classes declare
``needs_cpu_seq_lens = False`` (the flag the needs-cpu-seq-lens patch adds).
The one host value the verify step still needed is ``seq_lens_sum`` to size
the FULL_MASK tree mask; instead the target backend preallocates a worst-case
``cuda_graph_custom_mask`` in ``init_cuda_graph_state`` and hands it to
``build_tree`` through ``get_verify_buffers_to_fill_after_draft``, which fills
it in place.

The allocation and the buffer list are in ``patchkit.backends.trtllm_mla``;
the patched methods call it.

Releases: the TRT-LLM MLA classes are the same in 0.5.10 .. 0.5.12.post1 at
every edit site. 0.5.13 has the change natively. 0.5.17 replaced
``cuda_graph_custom_mask`` with a ``verify_mask`` property (built by
``maybe_create_verify_mask``): there the mask parts are superseded and only the
flags are checked.
"""

from __future__ import annotations

from patchkit.codemods.common.shared import FLAG, ClassFlag
from patchkit.codemods.common.tree_mask import (
    GET_BUFFERS,
    MASK,
    MAX_BS,
    AllocMask,
    InitMaskAndDraftRunner,
    VerifyBuffersReturnMask,
)
from patchkit.layout import import_path

BACKEND = "TRTLLMMLABackend"
DRAFT_BACKEND = "TRTLLMMLAMultiStepDraftBackend"
HELPERS = import_path("backends.trtllm_mla")


class _OptOutFlag(ClassFlag):
    """Upstream's layout (a blank line above, wherever the attribute lands);
    no ``__init__`` rule (TRT-LLM MLA never set the flag per instance)."""

    UPSTREAM_LAYOUT = True


class BackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{FLAG} = False: trtllm-gen kernels never read seq_lens_cpu / seq_lens_sum"
    CLASS = BACKEND
    WHY = (
        "trtllm-gen kernels rebuild metadata from preallocated buffers and never\n"
        "read seq_lens_cpu / seq_lens_sum; opt out of the D2H sync."
    )


class DraftBackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: per-step draft decode never reads seq_lens_cpu / seq_lens_sum"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Per-step draft decode never reads seq_lens_cpu / seq_lens_sum; opt out so\n"
        "decide_needs_cpu_seq_lens' OR over the backends stays False."
    )


# -- the verify tree mask (common's, with TRT-LLM MLA's helpers) -----------------------------


class InitCustomMask(InitMaskAndDraftRunner):
    __doc__ = InitMaskAndDraftRunner.__doc__
    DESCRIPTION = f"{BACKEND}.__init__ sets self.{MASK} = None and self.is_draft_runner (sglang #31527)"
    CLASS = BACKEND
    ALLOC_HELPER = "alloc_cuda_graph_custom_mask"


class AllocCustomMask(AllocMask):
    __doc__ = AllocMask.__doc__
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} in the compact QLEN_ONLY layout "
        "(bool, max_num_tokens * num_draft_tokens: trtllm-gen never reads it, sglang #32920) on the target "
        f"backend only (sglang #31527), and records the captured max_bs (self.{MAX_BS}) it fits"
    )
    CLASS = BACKEND
    HELPERS = HELPERS
    ALLOC_HELPER = "alloc_cuda_graph_custom_mask"
    READS_MASK = "False"
    READS_MASK_WHY = "Target verify runs the trtllm-gen kernel, which takes no tree mask (sglang #32920)."
    GATE_KEYWORDS = ("is_draft_runner=self.is_draft_runner",)


class VerifyBuffersReturnCustomMask(VerifyBuffersReturnMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND
    HELPERS = HELPERS
    BUFFERS_HELPER = "verify_buffers_to_fill_after_draft"
