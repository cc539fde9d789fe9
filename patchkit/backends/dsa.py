"""Run-time helpers for the DSA (NSA) spec-v2 patch: the sparse-attention backend without the CPU mirror.

DeepSeek sparse attention (``NativeSparseAttnBackend`` in ``nsa_backend.py``
up to 0.5.12.post1, ``DeepseekSparseAttnBackend`` in ``dsa_backend.py`` from
0.5.13) read the host maximum of ``seq_lens_cpu`` only to size the page table
it gathers from ``req_to_token``: its kernels stop every row at the device
``cache_seqlens`` (and at the indexer's top-k, which never passes them), so a
wider table changes what is copied, never what is read. sglang 0.5.15
(#29414) replays its CUDA graphs at the static width of the preallocated
page table; these helpers give exactly the old width when the mirror is
there and that static width when it is not, without a device read.

The eager ``init_forward_metadata`` takes ``backends.mirror_reads.host_max_seq_len``
(the batch's host bound of the seq-lens-host-bound patch, else
``max_context_len``) where upstream reads ``forward_batch.seq_lens.max().item()``
(sglang #33973: that read is a host wait whose timing differs between
DP-attention ranks).

0.5.7 .. 0.5.9 expanded the verify and draft-extend lengths on the host,
``torch.cat([torch.arange(kv - qo + 1, kv + 1) for qo, kv in zip(<host lists>)])``
with the kv lengths read from the mirror; 0.5.10 expands them on the device
(``seqlens_expand_triton``). :func:`seqlens_expand` is that expansion in torch
ops, for the trees that lack the kernel.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the function that needs it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def graph_max_len(seq_lens_cpu: Any, extra: int, page_table: Any, req_to_token: Any) -> int:
    """The page-table width a CUDA-graph replay writes: with the mirror,
    ``int(seq_lens_cpu.max().item() + extra)`` as before (``extra``: the
    draft tokens of target verify, else 0); without it, the width the
    preallocated ``page_table`` and ``req_to_token`` share (0.5.7 ..
    0.5.12.post1 allocate the table ``max_context_len + draft tokens`` wide and
    ``req_to_token`` 4 columns wider: the gather and the copy into the table
    then take the same columns)."""
    if seq_lens_cpu is not None:
        return int(seq_lens_cpu.max().item() + extra)
    return min(int(page_table.shape[1]), int(req_to_token.shape[1]))


def seqlens_expand(extend_seq_lens: Any, seq_lens: Any, total_len: int, max_q_len: Any = None) -> Any:
    """What 0.5.10's ``seqlens_expand_triton`` computes, in torch ops on
    ``seq_lens``' device, with no host read of a device value: row ``i`` gives
    ``seq_lens[i] - extend_seq_lens[i] + 1 .. seq_lens[i]`` (its
    ``extend_seq_lens[i]`` query tokens), the rows concatenated, int32.

    ``extend_seq_lens``: the query lengths on the device, or one host ``int``
    for a fixed width (target verify, the spec-v2 draft extend: no tensor is
    built from a host list, so no host-to-device copy). ``total_len``: their
    sum, a host value the caller has (``W * bs``, the sum of a host list); it
    sizes the output without reading the device. ``max_q_len``: the kernel's
    block width, unused here (kept for the kernel's signature)."""
    import torch

    kv = seq_lens.to(torch.int32)
    if isinstance(extend_seq_lens, int):
        offsets = torch.arange(1 - extend_seq_lens, 1, dtype=torch.int32, device=kv.device)
        return (kv.unsqueeze(1) + offsets).reshape(-1)
    qo = extend_seq_lens.to(torch.int32)
    rows = torch.repeat_interleave(
        torch.arange(qo.shape[0], device=kv.device), qo, output_size=total_len
    )  # output_size: no device read for the output's length
    starts = torch.cumsum(qo, 0, dtype=torch.int32) - qo
    within = torch.arange(total_len, dtype=torch.int32, device=kv.device) - starts[rows]
    return kv[rows] - qo[rows] + 1 + within
