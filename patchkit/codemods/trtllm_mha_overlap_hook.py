"""sglang #25925: TRT-LLM MHA takes part in the overlap plan stream.

The base ``AttentionBackend.update_verify_buffers_to_fill_after_draft`` raises
NotImplementedError, and ``TRTLLMHAAttnBackend`` does not override it, so the
overlap plan stream crashes with this backend. Its verify metadata (seq_lens,
page table, cu_seqlens) does not depend on draft tokens, so the hook is a no-op.
The body is inline (a ``pass``), exactly as upstream: there is no logic to ship.
"""

from __future__ import annotations

from patchkit.codemods.common.base import AddMethodCodemod

HOOK = "update_verify_buffers_to_fill_after_draft"

# Annotations are strings: a fork may lack ``from __future__ import annotations``
# and import SpecInput only under TYPE_CHECKING.
HOOK_SOURCE = f"""
def {HOOK}(
    self, spec_info: "SpecInput", cuda_graph_bs: "Optional[int]"
):
    # Verify metadata (seq_lens, page table, cu_seqlens) does not depend on
    # the draft tokens and the plan stream already computed it: no fix-up.
    pass
"""


class AddNoopVerifyBuffersHook(AddMethodCodemod):
    DESCRIPTION = f"TRTLLMHAAttnBackend.{HOOK}: a no-op override (base class raises NotImplementedError)"
    CLASS = "TRTLLMHAAttnBackend"
    METHOD = HOOK
    SOURCE = HOOK_SOURCE
    AFTER = ("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")
