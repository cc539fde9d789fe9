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

Imported by patched sglang code: standard library only at import time.
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
