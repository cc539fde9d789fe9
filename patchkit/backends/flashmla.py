"""Run-time helpers for the FlashMLA spec-v2 patch: the fixed-q draft extend (sglang #31090).

Spec v2's draft extend after verify (``DRAFT_EXTEND_V2``) extends every
request by the same window of ``num_draft_tokens`` tokens. Before #31090
FlashMLA handed it to its FlashInfer MLA parent, whose prefill plan is built
on the host from the CPU mirror and the host length lists (0.5.13 .. 0.5.15),
or let it reach its fixed-q kernel with the parent's metadata and the verify
lengths (0.5.10 .. 0.5.12.post1). Upstream runs it on the FlashMLA decode
kernel with ``window`` query rows per request and per-request K lengths kept
in the metadata; these helpers compute those lengths from device tensors
only. The block-table width reads of the mirror are in
``backends.mirror_reads``; the verify tree mask in ``backends.fa3``.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def draft_extend_seq_lens_k(seq_lens: Any, extend_seq_lens: Any, window: int) -> Any:
    """The K length each request's fixed window of ``window`` queries sees:
    its prefix (``seq_lens - extend_seq_lens``) plus the window, as the int32
    device tensor the FlashMLA kernel and its metadata take. With spec v2's
    uniform extend (every ``extend_seq_lens`` equals the window) this is
    ``seq_lens``; a shorter extend is padded to the window, as upstream does."""
    import torch

    return (seq_lens - extend_seq_lens + window).to(torch.int32)


def fixed_q_cache_seqlens(forward_batch: Any, metadata: Any, num_draft_tokens: int) -> Any:
    """``cache_seqlens`` for FlashMLA's fixed-q kernel: the draft extend's K
    lengths from its metadata (``seq_lens`` already holds the window there);
    for target verify, as before, ``seq_lens`` plus the draft tokens."""
    import torch

    if forward_batch.forward_mode.is_draft_extend_v2():
        return metadata.seq_lens_k
    return forward_batch.seq_lens.to(torch.int32) + num_draft_tokens
