"""A host-side bound on the decode batch's sequence lengths (issue 67, patch seq-lens-host-bound).

Without the CPU ``seq_lens`` mirror, an eager consumer that sized something
from the longest sequence (FA3's ``max_seq_len_k`` and its page-table gather,
Triton's ``kv_indices``) fell back to the static ``max_context_len``: 131072
columns a row at the Llama shapes where the batch holds a few hundred tokens.
The scheduler already knows a tight bound without reading the device: each
request's ``kv_allocated_len``, the KV slots the spec-v2 ``prepare_for_decode``
reserved for it (0.5.6.post2 .. 0.5.12.post1: ``kv_committed_len`` plus two
steps' worth, ``2 * max(topk * num_steps, num_draft_tokens)``). Every position
the step reads or writes lies in those slots, or the step would write KV it
does not own; so the allocated length bounds every row's length, the draft
tokens and the accepts still in flight included, and is a few tokens above
the truth.

``ScheduleBatch.get_model_worker_batch`` computes it (only when the batch has no
mirror) and ``ForwardBatch.init_new`` hands it on as ``seq_lens_host_bound``;
the consumers' helpers (``backends.mirror_reads.host_max_seq_len``,
``seq_lens.seq_lens_sum_or_bound`` ...) take the batch and read its
``seq_lens_host_bound`` in place of the static bound; each runtime module
stands alone (tests load them by path), so they read the attribute themselves. A batch without it
(CUDA-graph capture, a release whose requests keep no host allocation, the
patch not applied) keeps the static bound.

Two switches, for the GPU runs: ``PATCHKIT_SEQ_LEN_BOUND=static`` turns the
bound off (the static bound, as before: a comparison, never the default), and
``PATCHKIT_CHECK_SEQ_LEN_BOUND=1`` compares it with the device lengths at every
batch (a device read each time: for proving runs only) and raises when it is
below them.

Imported by patched sglang code: standard library only at import time.
"""

from __future__ import annotations

import os
from typing import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

OFF_SWITCH = "PATCHKIT_SEQ_LEN_BOUND"  # "static": the old max_context_len bound
CHECK_SWITCH = "PATCHKIT_CHECK_SEQ_LEN_BOUND"  # "1": check the bound against the device every batch


class SeqLensBound(NamedTuple):
    """Upper bounds of one batch's device lengths, known on the host."""

    max_len: int  # >= every row's length, its draft tokens and in-flight accepts included
    total: int  # >= the sum of the lengths over the batch's requests


def seq_lens_host_bound(reqs: Any, seq_lens_cpu: Any) -> Optional[SeqLensBound]:
    """The bound of a batch of ``reqs``, or None where it is not needed or not
    known: the batch has the CPU mirror (the exact values), the switch says
    ``static``, a request keeps no ``kv_allocated_len`` (0.5.4.post3, 0.5.5:
    the allocation lives on the device there), or there is no request."""
    if seq_lens_cpu is not None or os.environ.get(OFF_SWITCH, "") == "static":
        return None
    try:
        lens = [req.kv_allocated_len for req in reqs]
    except AttributeError:
        return None
    if not lens:
        # An idle batch (DP attention, no requests on this rank) may still run a
        # padded row: it keeps the static bound, which costs nothing there.
        return None
    return SeqLensBound(max(lens), sum(lens))


def checked_host_bound(bound: Optional[SeqLensBound], seq_lens: Any) -> Optional[SeqLensBound]:
    """``bound`` as given; with ``PATCHKIT_CHECK_SEQ_LEN_BOUND=1``, first read
    the device ``seq_lens`` (a sync: proving runs only) and raise when the
    bound is below their maximum or their sum, which would let a kernel stop
    short of the context it must read."""
    if bound is None or os.environ.get(CHECK_SWITCH, "") != "1" or seq_lens is None or seq_lens.numel() == 0:
        return bound
    longest, total = int(seq_lens.max()), int(seq_lens.sum())
    if longest > bound.max_len or total > bound.total:
        raise RuntimeError(
            f"patchkit seq_lens host bound too small: device max {longest} > {bound.max_len} "
            f"or sum {total} > {bound.total}"
        )
    return bound
