"""FlashInfer's custom-mask packing with the segment lengths known on the host
(issue 71): ``segment_packbits(mask, indptr, bitorder="little")`` without its
``.item()``, in one Triton kernel launch.

FlashInfer's ``plan()`` packs a verify's tree mask eight bits to a byte, row by
row (row ``r`` is ``qo_len * kv_len`` bits at page size 1), and reads the packed
total back with ``.item()`` to size its output: one host wait a verify.
flashinfer-host-indptr knows every row's bit count on the host, so the sizes
and offsets are host numbers and nothing is read back. The packing itself was
about fifteen small torch ops (``repeat_interleave``, ``arange``, indexing,
``where``): on an H200 they cost about 0.5 ms of host time a verify step, a
step of 7 ms at the small shape's captured bs 1 (docs/gpu.md, the sixteenth
run's profile). One kernel of patchkit's own now packs every row (0.5.23's
``pack_verify_mask_into`` is one kernel too, for verify rows of one width
only); the torch ops stay as the fallback without Triton and as the tests'
oracle.

Imported by patched sglang code: standard library only at import time; torch
and Triton are imported when the first mask is packed.
"""

from __future__ import annotations

import os

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["pack_mask_segments", "pack_mask_segments_reference"]

#: Packed bytes one Triton program writes (eight mask bits each).
BLOCK_BYTES = 128

_kernel = None  # the jitted kernel, built on first use (None: not built yet; False: no Triton)


def _build_kernel() -> Any:
    """The Triton kernel, or False when Triton is not importable."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return False

    @triton.jit
    def pack_rows(mask, table, packed, rows, BLOCK: tl.constexpr):
        # One program: BLOCK bytes of one row. ``table`` holds four int32 rows
        # of ``rows`` values: each row's bytes, first byte, bits, first bit.
        row = tl.program_id(0)
        byte = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        n_bytes = tl.load(table + row)
        first_byte = tl.load(table + rows + row).to(tl.int64)
        n_bits = tl.load(table + 2 * rows + row).to(tl.int64)
        first_bit = tl.load(table + 3 * rows + row).to(tl.int64)
        bit = tl.arange(0, 8)
        offsets = byte.to(tl.int64)[:, None] * 8 + bit[None, :]
        values = tl.load(mask + first_bit + offsets, mask=offsets < n_bits, other=0)
        weights = (values != 0).to(tl.int32) << bit[None, :]  # least significant bit first
        tl.store(packed + first_byte + byte, tl.sum(weights, axis=1).to(tl.uint8), mask=byte < n_bytes)

    return pack_rows


def _row_table(bits_per_row: Sequence[int]) -> tuple:
    """The per-row numbers of a packing, on the host: a fresh int32 tensor of ``5 * k + 1``
    values (pinned where CUDA is there, so it goes over without waiting): the four row
    vectors the kernel reads (bytes, first byte, bits, first bit), then the byte indptr
    handed back. Also the packed total and the longest row's bytes (host numbers)."""
    import numpy as np
    import torch

    bits = np.array(bits_per_row.numpy() if hasattr(bits_per_row, "numpy") else bits_per_row, dtype=np.int64)
    k = len(bits)
    fresh = torch.empty(5 * k + 1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
    values = fresh.numpy()
    byte_lens = (bits + 7) // 8
    byte_end = byte_lens.cumsum()
    table = values[: 4 * k].reshape(4, k)
    table[0], table[1], table[2], table[3] = byte_lens, byte_end - byte_lens, bits, bits.cumsum() - bits
    values[4 * k] = 0
    values[4 * k + 1 :] = byte_end
    total = int(byte_end[-1]) if k else 0
    longest = int(byte_lens.max()) if k else 0
    return fresh, total, longest


def pack_mask_segments(mask: Any, bits_per_row: Sequence[int]) -> tuple:
    """FlashInfer's ``segment_packbits(mask, indptr, bitorder="little")`` with
    the segment lengths known on the host: row ``r``'s bits ``mask[b_r : b_r
    + n_r]`` packed eight to a byte, least significant first, the last byte
    zero-padded. Returns the packed bytes (on the mask's device) and their
    int32 indptr (host); the sizes come from the host lengths, so nothing is
    read back from the device. The row vectors go over in one copy of one
    pinned tensor (the GPU run of 2026-11-28 counted five host waits a step
    when each went over from pageable memory), and one kernel packs them."""
    global _kernel
    import torch

    fresh, total, longest = _row_table(bits_per_row)
    k = (len(fresh) - 1) // 5
    byte_indptr = fresh[4 * k :]
    if total == 0:
        return torch.empty(0, dtype=torch.uint8, device=mask.device), byte_indptr
    if _kernel is None:
        _kernel = _build_kernel()
    if _kernel is False or (mask.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")):
        return _pack_with_torch(mask, fresh, k, total), byte_indptr
    flat = mask.contiguous().view(-1)
    table = fresh[: 4 * k].to(mask.device, non_blocking=True)
    packed = torch.empty(total, dtype=torch.uint8, device=mask.device)
    _kernel[(k, -(-longest // BLOCK_BYTES))](flat, table, packed, k, BLOCK=BLOCK_BYTES)
    return packed, byte_indptr


def pack_mask_segments_reference(mask: Any, bits_per_row: Sequence[int]) -> tuple:
    """What the kernel does, in torch ops: the fallback without Triton and the tests' oracle."""
    fresh, total, _ = _row_table(bits_per_row)
    k = (len(fresh) - 1) // 5
    if total == 0:
        import torch

        return torch.empty(0, dtype=torch.uint8, device=mask.device), fresh[4 * k :]
    return _pack_with_torch(mask, fresh, k, total), fresh[4 * k :]


def _pack_with_torch(mask: Any, fresh: Any, k: int, total: int) -> Any:
    import torch

    device = mask.device
    flat = mask.contiguous().view(-1).to(torch.bool)
    lens_d, byte_start_d, bits_d, bit_start_d = fresh[: 4 * k].view(4, k).to(device, non_blocking=True)
    rows = torch.repeat_interleave(torch.arange(k, device=device), lens_d, output_size=total)
    byte_in_row = torch.arange(total, device=device) - byte_start_d[rows]
    bit_in_row = byte_in_row[:, None] * 8 + torch.arange(8, device=device)[None, :]
    valid = bit_in_row < bits_d[rows][:, None]
    source = torch.where(valid, bit_start_d[rows][:, None] + bit_in_row, 0)
    taken = flat[source] & valid
    weights = torch.bitwise_left_shift(
        torch.ones(8, dtype=torch.int32, device=device), torch.arange(8, device=device, dtype=torch.int32)
    )
    return (taken.to(torch.int32) * weights).sum(dim=1).to(torch.uint8)
