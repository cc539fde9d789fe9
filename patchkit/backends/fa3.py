"""Run-time helpers for the FA3 spec-v2 patch (sglang #29343, #29589, #31364, #31527).

``FlashAttentionBackend`` (FA3, the Hopper default) read the CPU mirror of
``seq_lens`` on every spec-v2 path: the host maximum sized the page table it
gathers from ``req_to_token``, and its CUDA-graph replay sliced the mirror.
Once FA3 opts out of the mirror these reads get ``None``; the helpers below
give the old value when the mirror is there and a static, sync-free bound when
it is not. FA3's kernels bound every row by ``cache_seqlens`` (device), so a
page table wider than the longest sequence is correct: only the width of the
gather grows, never what the kernel reads.

The verify tree mask: ``build_tree_kernel_efficient`` sizes a FULL_MASK tree
mask with ``seq_lens_sum`` (a host value) unless the target backend hands it a
preallocated buffer through ``get_verify_buffers_to_fill_after_draft``; the
target FA3 backend now preallocates the worst case once. Draft-side FA3
instances (the draft worker's draft-extend backend is a full FA3 backend) never
verify, so they must not pay for it.

CUDA-graph replay: the runners keep pinned ``seq_lens_cpu`` buffers and used
to hand them to the backend even when the batch had no mirror, i.e. a tensor
holding the lengths of some earlier batch. :func:`mirror_or_none` makes replay
pass ``None`` then, so None-aware backend code takes its sync-free path
instead of trusting stale lengths.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence


# -- reads of the CPU mirror ----------------------------------------------------------------


def host_max_seq_len(seq_lens_cpu: Any, bound: int) -> int:
    """``seq_lens_cpu.max().item()``, or ``bound`` (the backend's
    ``max_context_len``) when the batch has no CPU mirror.

    FA3 uses this host value only to size the page table it gathers from
    ``req_to_token`` (and, on normal decode, the split heuristic of
    ``scheduler_metadata``): the static bound gives every row all of its
    context without a device-to-host copy.
    """
    if seq_lens_cpu is None:
        return bound
    return seq_lens_cpu.max().item()


def rows_or_none(seq_lens_cpu: Any, rows: int) -> Any:
    """``seq_lens_cpu[:rows]``, or None when there is no mirror."""
    return None if seq_lens_cpu is None else seq_lens_cpu[:rows]


def rows_max(seq_lens_cpu: Any, seq_lens: Any, rows: int) -> int:
    """``int(seq_lens_cpu[:rows].max().item())``; without the mirror, the same
    maximum read from the device lengths. That is a local sync, kept only for
    the prefill-aware sliding-window ratchet, which needs the true maximum (a
    static bound would widen its window for good); sglang 0.5.16 does the same."""
    source = seq_lens_cpu if seq_lens_cpu is not None else seq_lens
    return int(source[:rows].max().item())


def any_host_lens(lens: Optional[Sequence[int]]) -> bool:
    """``any(lens)`` for a host list of lengths that the GPU-only draft extend
    leaves unset (its prefix lengths stay a device tensor): False then, and the
    draft-extend test next to it decides."""
    return lens is not None and any(lens)


def max_host_lens(lens: Optional[Sequence[int]], fixed: int) -> int:
    """``max(lens)``, or ``fixed`` (the draft-extend q width, the configured
    number of draft tokens) when the host list is unset."""
    if lens is None:
        return fixed
    return max(lens)


def mirror_or_none(mirror: Any, replay_buffer: Any) -> Any:
    """The pinned CUDA-graph ``seq_lens_cpu`` buffer for replay when the batch
    brought a mirror (the runner copied it in), else None: without a mirror the
    buffer was not refreshed and holds lengths of an earlier batch."""
    return None if mirror is None else replay_buffer


# -- the verify tree mask -------------------------------------------------------------------


def needs_verify_tree_mask(num_draft_tokens: Optional[int], skip_prefill: bool, is_draft_runner: bool) -> bool:
    """Does this FA3 instance verify? Only the target backend of speculative
    decoding does: draft tokens configured, not a draft step backend
    (``skip_prefill``) and not on the draft worker."""
    return bool(num_draft_tokens) and not skip_prefill and not is_draft_runner


def verify_tree_mask_numel(max_num_tokens: int, max_context_len: int, num_draft_tokens: int) -> int:
    """Worst-case FULL_MASK tree mask: each verify token has one row of
    ``context + draft tokens`` entries."""
    return max_num_tokens * (max_context_len + num_draft_tokens)


def alloc_verify_tree_mask(
    *,
    max_num_tokens: int,
    max_context_len: int,
    num_draft_tokens: Optional[int],
    skip_prefill: bool,
    is_draft_runner: bool,
    device: Any,
):
    """The preallocated verify tree mask (zeroed bool, see
    :func:`verify_tree_mask_numel`) on ``device``, or None for an instance that
    never verifies."""
    if not needs_verify_tree_mask(num_draft_tokens, skip_prefill, is_draft_runner):
        return None
    import torch

    return torch.zeros(
        verify_tree_mask_numel(max_num_tokens, max_context_len, num_draft_tokens),
        dtype=torch.bool,
        device=device,
    )


def verify_buffers(tree_mask: Any) -> list:
    """``[tree mask, positions]`` that ``build_tree_kernel_efficient`` fills
    after draft: the preallocated mask (None when there is none, and the worker
    sizes one itself) and no position buffer (FA3 reads positions from the
    batch)."""
    return [tree_mask, None]


# -- the page-table width -------------------------------------------------------------------


def pages_within(pages: int, page_table: Any) -> int:
    """``pages``, at most the width of the preallocated CUDA-graph
    ``page_table`` that many columns are written into.

    With the mirror the limit never binds (a sequence longer than the table
    would not fit it in the first place). Without it the pages come from the
    static bound plus the step's extra tokens, which may pass the table's
    ``ceil(max_context_len / page_size)`` columns; the fused Triton writer
    masks only by this count, so the limit keeps it inside the buffer (the
    whole table is then rewritten from the device ``req_to_token``).
    """
    return min(pages, page_table.shape[1])
