"""Reads of the CPU ``seq_lens`` mirror by attention backends, without the mirror.

Once a backend opts out of the spec-v2 seq_lens device-to-host sync
(``needs_cpu_seq_lens = False``), every read it made of ``seq_lens_cpu`` /
host length lists on the spec paths gets ``None``. These helpers give exactly
the old value when the mirror is there and a static, sync-free bound when it
is not. FA3 and TRT-LLM MHA use the host maximum only to size the page table
they gather from ``req_to_token``; their kernels stop every row at the device
``cache_seqlens``, so a table wider than the longest sequence is correct: only
the width of the gather grows, never what the kernel reads.

CUDA-graph replay: the runners keep pinned ``seq_lens_cpu`` buffers and used
to hand them to the backend even when the batch had no mirror, i.e. a tensor
holding the lengths of some earlier batch. :func:`mirror_or_none` makes replay
pass ``None`` then, so None-aware backend code takes its sync-free path
instead of trusting stale lengths.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it (none here needs it).
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence


__all__ = ["host_max_seq_len", "rows_or_none", "rows_max", "any_host_lens", "max_host_lens", "mirror_or_none",
           "pages_within", "plus_or_none"]


# -- reads of the CPU mirror ----------------------------------------------------------------


def host_max_seq_len(seq_lens_cpu: Any, bound: int, batch: Any = None) -> int:
    """``seq_lens_cpu.max().item()``; without the CPU mirror, the ``batch``'s
    host bound (``seq_lens_host_bound.max_len``, patch seq-lens-host-bound:
    the longest KV allocation, a few tokens above the truth) where it has one,
    at most ``bound`` (the backend's static ``max_context_len``).

    FA3 and TRT-LLM MHA use this host value only to size the page table they
    gather from ``req_to_token`` (FA3, on normal decode, also the split
    heuristic of ``scheduler_metadata``): either bound gives every row all of
    its context without a device-to-host copy; the host one keeps the gather
    as narrow as the batch.
    """
    if seq_lens_cpu is None:
        host = getattr(batch, "seq_lens_host_bound", None)  # runtime.host_bound.SeqLensBound
        return bound if host is None else min(bound, host.max_len)
    return seq_lens_cpu.max().item()


def rows_or_none(seq_lens_cpu: Any, rows: int) -> Any:
    """``seq_lens_cpu[:rows]``, or None when there is no mirror."""
    return None if seq_lens_cpu is None else seq_lens_cpu[:rows]


def plus_or_none(seq_lens_cpu: Any, delta: int) -> Any:
    """``seq_lens_cpu + delta`` (FlashMLA's verify lengths: the mirror plus the
    draft tokens), or None when there is no mirror."""
    return None if seq_lens_cpu is None else seq_lens_cpu + delta


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
