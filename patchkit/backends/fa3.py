"""Run-time helpers for the FA3 spec-v2 patch: the verify tree mask (sglang #29589, #31527).

``build_tree_kernel_efficient`` sizes a FULL_MASK tree mask with
``seq_lens_sum`` (a host value) unless the target backend hands it a
preallocated buffer through ``get_verify_buffers_to_fill_after_draft``; the
target FA3 backend now preallocates the worst case once. Draft-side FA3
instances (the multi-step wrapper's step backends and the draft worker's
draft-extend backend, all built on the draft worker's model runner) never
verify, so they must not pay for it. The mirror reads FA3 makes are handled by
``backends.mirror_reads``.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional


# -- the verify tree mask -------------------------------------------------------------------


def needs_verify_tree_mask(num_draft_tokens: Optional[int], skip_prefill: bool, is_draft_runner: bool) -> bool:
    """Does this FA3 instance verify? Only the target backend of speculative
    decoding does: draft tokens configured, not a draft step backend
    (``skip_prefill``) and not on the draft worker."""
    return bool(num_draft_tokens) and not skip_prefill and not is_draft_runner


def verify_tree_mask_numel(max_num_tokens: int, max_context_len: int, num_draft_tokens: int, reads_mask: bool = True) -> int:
    """Worst-case tree mask: each verify token has one row of ``context +
    draft tokens`` entries (FULL_MASK), or of ``draft tokens`` entries where
    the backend never reads the mask (the compact QLEN_ONLY layout, sglang
    #32920: FA3 reads it only with topk > 1, FlashMLA never)."""
    if not reads_mask:
        return max_num_tokens * num_draft_tokens
    return max_num_tokens * (max_context_len + num_draft_tokens)


def alloc_verify_tree_mask(
    *,
    max_num_tokens: int,
    max_context_len: int,
    num_draft_tokens: Optional[int],
    skip_prefill: bool,
    is_draft_runner: bool,
    device: Any,
    reads_mask: bool = True,
):
    """The preallocated verify tree mask (zeroed bool, see
    :func:`verify_tree_mask_numel`; compact where ``reads_mask`` is False) on
    ``device``, or None for an instance that never verifies."""
    if not num_draft_tokens or not needs_verify_tree_mask(num_draft_tokens, skip_prefill, is_draft_runner):
        return None
    import torch

    return torch.zeros(
        verify_tree_mask_numel(max_num_tokens, max_context_len, num_draft_tokens, reads_mask),
        dtype=torch.bool,
        device=device,
    )


def verify_buffers(tree_mask: Any) -> list:
    """``[tree mask, positions]`` that ``build_tree_kernel_efficient`` fills
    after draft: the preallocated mask (None when there is none, and the worker
    sizes one itself) and no position buffer (FA3 reads positions from the
    batch)."""
    return [tree_mask, None]
