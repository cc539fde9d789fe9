"""Run-time helpers for the TRT-LLM MLA backend patches (sglang #26824).

Patched ``TRTLLMMLABackend`` code calls these; they hold the logic so that it
is unit-tested here on CPU (and on a GPU, inside a captured CUDA graph).

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: the typing names are for type
# checkers only (annotations are strings here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional


def needs_cuda_graph_custom_mask(num_draft_tokens: Optional[int], skip_prefill: bool, is_draft_runner: bool = False) -> bool:
    """Is there a verify step whose tree mask the backend must preallocate?

    Only the target backend of speculative decoding (draft tokens configured)
    runs verify; draft step backends are built with ``skip_prefill=True``,
    and the draft worker's draft-extend backend (``is_draft_runner``, sglang
    #31527) never verifies either.
    """
    return bool(num_draft_tokens) and not skip_prefill and not is_draft_runner


def cuda_graph_custom_mask_numel(max_num_tokens: int, max_context_len: int, num_draft_tokens: int, reads_mask: bool = True) -> int:
    """Worst-case tree mask: one row of ``context + draft`` entries per verify
    token (FULL_MASK), or of ``draft`` entries where nothing reads the mask
    (the compact QLEN_ONLY layout, sglang #32920; trtllm-gen kernels never
    read it)."""
    if not reads_mask:
        return max_num_tokens * num_draft_tokens
    return max_num_tokens * (max_context_len + num_draft_tokens)


def alloc_cuda_graph_custom_mask(
    *,
    max_num_tokens: int,
    max_context_len: int,
    num_draft_tokens: Optional[int],
    skip_prefill: bool,
    device: Any,
    is_draft_runner: bool = False,
    reads_mask: bool = True,
):
    """The preallocated verify tree mask, or None when there is no verify step.

    A zeroed bool tensor of :func:`cuda_graph_custom_mask_numel` cells on
    ``device``. ``build_tree`` fills it in place, so the GPU-only spec-v2 path
    never needs ``seq_lens_sum`` (a host value) to size it.
    """
    if not num_draft_tokens or not needs_cuda_graph_custom_mask(num_draft_tokens, skip_prefill, is_draft_runner):
        return None
    import torch

    return torch.zeros(
        cuda_graph_custom_mask_numel(max_num_tokens, max_context_len, num_draft_tokens, reads_mask),
        dtype=torch.bool,
        device=device,
    )


def verify_buffers_to_fill_after_draft(custom_mask) -> list:
    """``[tree mask buffer, position buffer]`` for the verify step: the
    preallocated mask (None when none was allocated) and no position buffer."""
    return [custom_mask, None]
