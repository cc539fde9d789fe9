"""A page table built on the device, each row stopped at its real length
(the idea of sglang #28106 / #29343 / #32109; patchkit's own kernel).

Without the CPU seq_lens mirror, the CUDA-graph replays of FA3 and TRT-LLM
MHA sized their ``req_to_token`` gather with the static bound
``max_context_len``: every replay read and wrote ``bs * max_context_len /
page_size`` entries, whatever the batch's lengths. The kernels that read the
table stop every row at the device ``cache_seqlens``, so only the first
``ceil(cache_seqlens[i] / page_size)`` entries of row ``i`` are ever read.
:func:`fill_page_table_rows` writes exactly those, from the device lengths:
no host max, no sync, and work proportional to the real lengths. The rest of
each row keeps what an earlier replay left there, which nothing reads.

Sliding-window (SWA) models translate every entry through their pool; the
helper declines them (returns False) and the caller keeps its own gather.

The eager metadata (no CUDA graph: batches above the captured size, prefill)
gathered a fresh ``bs x width`` token table the same way and strided it into
pages: :func:`eager_page_table` builds the page table directly instead, a
fresh table per forward as upstream's does (sglang #28578 announced a reused
eager buffer; it never landed, see docs/research/upstream-followups.md).

Imported by patched sglang code: standard library only at import time; torch
and Triton are imported when the first table is built.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["eager_page_table", "fill_page_table_rows", "fill_page_table_rows_reference", "live_pages"]

#: Page-table columns one Triton program writes.
BLOCK_COLS = 1024

_kernel = None  # the jitted kernel, built on first use (None: not built yet; False: no Triton)


def live_pages(kv_len: int, page_size: int, width: int) -> int:
    """How many entries of a row the attention kernels read: ``ceil(kv_len /
    page_size)``, at most the table's ``width``."""
    return min(max(-(-int(kv_len) // page_size), 0), width)


def _build_kernel():
    """The Triton kernel, or False when Triton is not importable."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return False

    @triton.jit
    def rows_to_real_length(
        req_to_token,
        req_pool_indices,
        kv_lens,
        page_table,
        token_row_stride,
        table_row_stride,
        width,
        PAGE_SIZE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program: BLOCK columns of one row. Columns past the row's live
        # pages are masked, so a short row costs (almost) nothing.
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        kv_len = tl.load(kv_lens + row).to(tl.int64)
        pages = tl.minimum((kv_len + PAGE_SIZE - 1) // PAGE_SIZE, width)
        live = cols < pages
        pool_row = tl.load(req_pool_indices + row).to(tl.int64)
        token = tl.load(req_to_token + pool_row * token_row_stride + cols.to(tl.int64) * PAGE_SIZE, mask=live, other=0)
        tl.store(page_table + row * table_row_stride + cols, (token // PAGE_SIZE).to(tl.int32), mask=live)

    return rows_to_real_length


def fill_page_table_rows_reference(req_to_token: Any, req_pool_indices: Any, kv_lens: Any, page_table: Any, page_size: int) -> None:
    """What the kernel does, in torch: the fallback without Triton (a full-width
    gather again, but still without a host read) and the tests' oracle."""
    import torch

    rows, width = req_pool_indices.shape[0], page_table.shape[1]
    cols = torch.arange(width, device=page_table.device)
    pages = torch.clamp((kv_lens[:rows].to(torch.int64) + page_size - 1) // page_size, 0, width)
    live = cols[None, :] < pages[:, None]
    columns = torch.clamp(cols * page_size, max=req_to_token.shape[1] - 1)
    tokens = req_to_token[req_pool_indices[:, None], columns[None, :]]
    table = page_table[:rows]
    table.copy_(torch.where(live, (tokens // page_size).to(table.dtype), table))


def fill_page_table_rows(
    req_to_token: Any,
    req_pool_indices: Any,
    kv_lens: Any,
    page_table: Any,
    page_size: int,
    swa_page_table: Any = None,
) -> bool:
    """Write ``page_table[i, :ceil(kv_lens[i] / page_size)]`` = the pages of
    request ``req_pool_indices[i]`` in ``req_to_token``, for every row ``i`` of
    ``req_pool_indices``, without reading any length on the host.

    ``page_table`` is the preallocated (CUDA-graph) int32 table, written in
    place; ``kv_lens`` the device lengths the attention kernels stop at
    (``cache_seqlens_int32``). Returns False, writing nothing, when the batch
    also needs a sliding-window table (``swa_page_table`` is not None): the
    caller's own gather translates those entries.
    """
    global _kernel
    if swa_page_table is not None:
        return False
    req_pool_indices = req_pool_indices.reshape(-1)  # a fork's rows[:, None]-shaped index too
    rows = req_pool_indices.shape[0]
    if rows == 0:
        return True
    if page_table.shape[0] < rows:
        raise ValueError(f"page table has {page_table.shape[0]} rows for a batch of {rows}")
    if _kernel is None:
        _kernel = _build_kernel()
    if _kernel is False or (req_to_token.device.type != "cuda" and not _interpreting()):
        fill_page_table_rows_reference(req_to_token, req_pool_indices, kv_lens, page_table, page_size)
        return True
    width = page_table.shape[1]
    grid = (rows, -(-width // BLOCK_COLS))
    _kernel[grid](
        req_to_token,
        req_pool_indices,
        kv_lens,
        page_table,
        req_to_token.stride(0),
        page_table.stride(0),
        width,
        PAGE_SIZE=page_size,
        BLOCK=BLOCK_COLS,
    )
    return True


def eager_page_table(req_to_token: Any, req_pool_indices: Any, kv_lens: Any, page_size: int) -> Any:
    """A new int32 page table for an eager forward: one row per entry of
    ``req_pool_indices``, ``ceil(req_to_token.shape[1] / page_size)`` columns
    (as many pages as a ``req_to_token`` row holds, so any row fits), row
    ``i`` built up to ``ceil(kv_lens[i] / page_size)`` by
    :func:`fill_page_table_rows`. The rest is zeros, not left uninitialised
    as upstream's ``torch.empty``: no kernel reads past ``kv_lens``, and a
    zero is a valid page should one prefetch."""
    import torch

    rows = req_pool_indices.reshape(-1).shape[0]
    width = -(-req_to_token.shape[1] // page_size)
    table = torch.zeros((rows, width), dtype=torch.int32, device=req_to_token.device)
    fill_page_table_rows(req_to_token, req_pool_indices, kv_lens, table, page_size)
    return table


def _interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): the kernel runs on CPU tensors."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
