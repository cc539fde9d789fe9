"""Which batches the preallocated verify tree mask fits (the bound of sglang #33127).

The target backends patchkit patches (FA3, FlashMLA, TRT-LLM MLA) preallocate
the FULL_MASK verify tree mask once, at CUDA-graph capture
(``init_cuda_graph_state``), for the largest captured batch: ``max_bs``
requests of at most ``max_context_len`` tokens, ``num_draft_tokens`` rows of
``context + draft tokens`` cells each. ``build_tree_kernel_efficient`` writes
``num_draft_tokens * sum(seq_lens) + bs * num_draft_tokens ** 2`` cells into
whatever buffer it is handed, without a bounds check. An eager batch above
the captured size (``max_running_requests`` > ``cuda_graph_max_bs``) would
write past the buffer's end, so the spec-v2 draft worker hands the buffer
over only to a batch it fits (:func:`verify_tree_mask_for_batch`); for any
other batch it hands None and sizes a mask of its own, as pristine sglang did
for every batch (from ``seq_lens_sum``, or its bound ``bs * max_context_len``
without the CPU mirror: needs-cpu-seq-lens' ``tree_mask_seq_lens_sum``).

The backend records the batch size it sized the mask for in
:data:`MAX_BS_ATTR` next to the mask (``cuda_graph_custom_mask``), and in
:data:`IS_READ_ATTR` whether its verify reads the mask at all (sglang #32886,
#32920): FlashMLA and TRT-LLM MLA never do, FA3 only with topk > 1. An unread
mask takes the compact QLEN_ONLY layout (``D * D`` cells a request instead of
``D * (context + D)``), so ``build_tree_kernel_efficient`` no longer fills a
context-wide buffer every verify step and none is held
(:func:`tree_mask_mode_for` hands the kernel that layout).

Imported by patched sglang code: standard library only at import time.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: The backend attribute holding the batch size its tree mask was sized for.
MAX_BS_ATTR = "verify_tree_mask_max_bs"
#: The backend attribute saying whether its verify reads the tree mask
#: (absent: it does, the FULL_MASK layout the worker asks for).
IS_READ_ATTR = "verify_tree_mask_is_read"
#: sglang's ``TreeMaskMode.QLEN_ONLY`` (stable since the mode was added, sglang #7756).
QLEN_ONLY = 1


def full_mask_numel(bs: int, num_draft_tokens: int, max_context_len: int) -> int:
    """The most cells ``build_tree_kernel_efficient`` writes in the FULL_MASK
    layout for ``bs`` requests of at most ``max_context_len`` tokens: per
    request ``num_draft_tokens`` rows of ``seq_len + num_draft_tokens``."""
    return bs * num_draft_tokens * (max_context_len + num_draft_tokens)


def qlen_only_numel(bs: int, num_draft_tokens: int) -> int:
    """The cells ``build_tree_kernel_efficient`` writes in the QLEN_ONLY
    layout: per request ``num_draft_tokens`` rows of ``num_draft_tokens``."""
    return bs * num_draft_tokens * num_draft_tokens


def tree_mask_numel(bs: int, num_draft_tokens: int, max_context_len: int, is_read: bool = True) -> int:
    """The most cells the kernel writes for ``bs`` requests: FULL_MASK for a
    backend that reads the mask, else the compact QLEN_ONLY layout."""
    if is_read:
        return full_mask_numel(bs, num_draft_tokens, max_context_len)
    return qlen_only_numel(bs, num_draft_tokens)


def tree_mask_fits(
    tree_mask: Any, max_bs: Optional[int], bs: int, num_draft_tokens: int, max_context_len: int, is_read: bool = True
) -> bool:
    """Does the preallocated ``tree_mask`` (sized for ``max_bs`` requests)
    hold everything the kernel may write for a batch of ``bs`` requests? Both
    bounds: the batch is within the captured size, and the buffer covers the
    worst case of this batch in its layout (so a buffer sized from fewer
    tokens than ``max_bs * num_draft_tokens`` is refused too)."""
    if tree_mask is None or max_bs is None or bs > max_bs:
        return False
    return tree_mask.numel() >= tree_mask_numel(bs, num_draft_tokens, max_context_len, is_read)


def reads_tree_mask(attn_backend: Any) -> bool:
    """Does this target backend's verify read the tree mask? True unless the
    backend recorded otherwise (one patchkit did not patch keeps its layout)."""
    return getattr(attn_backend, IS_READ_ATTR, True) is not False


def tree_mask_mode_for(tree_mask_mode: Any, attn_backend: Any) -> Any:
    """The layout the spec-v2 draft worker asks ``build_tree_kernel_efficient``
    for: the worker's own (``tree_mask_mode``) where the target backend reads
    the mask, else QLEN_ONLY, which writes ``D * D`` cells a request and fills
    only those (sglang #32920). The mask is then never read, so its layout
    changes nothing the verify computes; positions and the retrieve indices
    the kernel writes do not depend on it."""
    if reads_tree_mask(attn_backend):
        return tree_mask_mode
    return getattr(type(tree_mask_mode), "QLEN_ONLY", QLEN_ONLY)


def verify_tree_mask_for_batch(tree_mask_buf: Any, attn_backend: Any, seq_lens: Any, num_draft_tokens: int) -> Any:
    """The tree-mask buffer the spec-v2 draft worker hands
    ``build_tree_kernel_efficient`` for the batch of ``seq_lens``: the target
    backend's preallocated mask when it fits the batch, else None (the worker
    then allocates one for this batch, as before the mask was preallocated).

    A backend that records no ``max_bs`` (one patchkit did not patch, e.g.
    pristine Triton, or an upstream release's own hook) gets its buffer
    handed over as it returned it: that is its own contract."""
    if tree_mask_buf is None:
        return None
    max_bs = getattr(attn_backend, MAX_BS_ATTR, None)
    if max_bs is None:
        return tree_mask_buf
    bs = seq_lens.shape[0]
    is_read = reads_tree_mask(attn_backend)
    if tree_mask_fits(tree_mask_buf, max_bs, bs, num_draft_tokens, attn_backend.max_context_len, is_read):
        return tree_mask_buf
    return None
