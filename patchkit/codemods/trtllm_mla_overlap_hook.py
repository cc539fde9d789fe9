"""sglang 0.5.19: TRT-LLM MLA takes part in the overlap plan stream.

Under ``SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1`` the spec-v2 worker plans the
verify metadata on a side stream before the draft finished, then calls the
target backend's ``update_verify_buffers_to_fill_after_draft`` to redo what
depends on the draft's output. ``TRTLLMMLABackend`` does not override it and
neither does its parent (FlashInfer MLA), so the base class raises
NotImplementedError on the first verify. Its verify runs the trtllm-gen
kernel from seq_lens, block tables and cu_seqlens the plan stream computed,
none of which depends on the draft tokens, and it never reads the tree mask
or the positions buffer: the hook has nothing to redo. The body is inline (a
``pass``), as upstream has it from 0.5.19 (first method of the class).
"""

from __future__ import annotations

from patchkit.codemods.common.base import AddMethodCodemod

HOOK = "update_verify_buffers_to_fill_after_draft"

# Annotation-free, as upstream's: a fork may import SpecInput only under TYPE_CHECKING.
HOOK_SOURCE = f"""
def {HOOK}(self, spec_info, cuda_graph_bs):
    # Verify metadata (seq_lens, block tables, cu_seqlens) does not depend on
    # the draft tokens and trtllm-gen reads no tree mask: nothing to redo
    # after the draft (base class: NotImplementedError under the overlap plan stream).
    pass
"""


class AddNoopVerifyBuffersHook(AddMethodCodemod):
    DESCRIPTION = f"TRTLLMMLABackend.{HOOK}: a no-op override (base class raises NotImplementedError)"
    CLASS = "TRTLLMMLABackend"
    METHOD = HOOK
    SOURCE = HOOK_SOURCE
    AFTER = ("get_verify_buffers_to_fill_after_draft", "init_cuda_graph_state")
