"""Run-time logic of the ``needs-cpu-seq-lens`` patch (sglang #26128 + #26738).

The spec-v2 overlap scheduler keeps a CPU mirror of ``seq_lens``
(``seq_lens_cpu`` and ``seq_lens_sum``), paid for with a device-to-host copy
and a ``sum()`` every decode step. Attention backends that never read it
declare ``needs_cpu_seq_lens = False``; when every backend in use does (and
two-batch overlap is off, and piecewise CUDA graph is off or its runners are
known not to read the mirror: sglang #28633), the copy is skipped:
the mirror is ``None`` and each consumer takes a GPU-only or upper-bound path.

Patched sglang code calls the functions below. Three groups:

* the decision (:func:`decide_needs_cpu_seq_lens`), taken once by the
  scheduler's overlap init (:func:`configure_needs_cpu_seq_lens`) and read by
  the code that owns the sync (:func:`needs_cpu_seq_lens`);
* None-aware versions of the arithmetic the consumers do on the mirror
  (:func:`add_or_none`, :func:`cat_or_none`, :func:`index_or_none`, ...);
* upper-bound fallbacks for sizes computed from the mirror, and the decode
  metrics fallback (``sum(req.seqlen for req in batch.reqs)``).

Each function behaves exactly like the code it replaces when the mirror is
there. Standard library only at import time; torch is imported inside the
functions that need it.
"""

from __future__ import annotations

# Patched sglang imports this at start-up: keep it to nothing but this file.
# `logging` is imported where it is used, and the typing names are only for
# type checkers (annotations are strings here); type checkers honour a
# module-level TYPE_CHECKING = False as they do typing.TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional, Sequence

# -- the decision ------------------------------------------------------------------

# One scheduler per process (each TP / DP / PP rank runs in its own), so one
# value per process is exact. The default keeps the legacy behaviour: a tree
# where only the sync side is patched still copies.
_needs_cpu_seq_lens = True


def needs_cpu_seq_lens() -> bool:
    """Must the spec-v2 decode step produce the CPU mirror of seq_lens?"""
    return _needs_cpu_seq_lens


def set_needs_cpu_seq_lens(flag: bool) -> None:
    global _needs_cpu_seq_lens
    _needs_cpu_seq_lens = bool(flag)


def _piecewise_cuda_graph_on(server_args: Any) -> bool:
    """Whether the server runs piecewise CUDA graph: on unless disabled from 0.5.10
    (``disable_piecewise_cuda_graph``); before, only when asked for
    (``enable_piecewise_cuda_graph``, off by default in 0.5.4 .. 0.5.9); with
    neither switch, on (keeping the mirror is the safe side)."""
    if hasattr(server_args, "disable_piecewise_cuda_graph"):
        return not server_args.disable_piecewise_cuda_graph
    return bool(getattr(server_args, "enable_piecewise_cuda_graph", True))


def decide_needs_cpu_seq_lens(server_args: Any, attn_backends: Sequence[Any], piecewise_reads_mirror: bool = True) -> bool:
    """sglang's rule (#26128, with #26738's fixes).

    True under two-batch overlap (it reads the CPU mirror outside the
    attention backends). True when piecewise CUDA graph is on, unless
    ``piecewise_reads_mirror`` is False: the patch piecewise-no-forced-mirror
    (sglang #28633) passes False once it has checked that the tree's piecewise
    runners only hand the mirror through and never run a batch that lacks it.
    Otherwise the OR of the backends' ``needs_cpu_seq_lens``: ``None`` entries
    (unset slots, e.g. no draft-extend backend) are skipped, and a backend
    without the attribute counts as True (undeclared backends stay on the
    legacy path). The flag is read on the instance: a backend that decides
    per model wins over its class (DeepSeek sparse attention 0.5.20 .. 0.5.21:
    ``needs_cpu_seq_lens = dsa_index_kpool > 1``, a pooled indexer keeps the
    mirror; docs/research/dp-attention.md §7 has DSA per release and setting).
    """
    if getattr(server_args, "enable_two_batch_overlap", False):
        return True
    if piecewise_reads_mirror and _piecewise_cuda_graph_on(server_args):
        return True
    return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)


def spec_v2_attn_backends_of(draft_worker: Any) -> Optional[tuple]:
    """The attention backends a spec-v2 worker uses, or None when the worker
    does not list them (it was not audited for the GPU-only path: keep the
    mirror)."""
    if draft_worker is None:
        return None
    backends = getattr(draft_worker, "spec_v2_attn_backends", None)
    return tuple(backends) if backends is not None else None


def configure_needs_cpu_seq_lens(server_args: Any, draft_worker: Any, tp_worker: Any, piecewise_reads_mirror: bool = True) -> bool:
    """Take the decision for this scheduler and hand it to the sync owner.

    Called once from ``Scheduler.init_overlap``. Without a spec-v2 worker that
    lists its backends (no speculative decoding, or a worker such as the
    multi-layer EAGLE one) the mirror is kept. Multimodal-rope models keep it
    too: ``ForwardBatch._compute_mrope_positions`` reads ``seq_lens_cpu`` on the
    draft-extend path (not guarded upstream either). ``piecewise_reads_mirror``:
    see :func:`decide_needs_cpu_seq_lens`.
    """
    backends = spec_v2_attn_backends_of(draft_worker)
    model_runner = getattr(tp_worker, "model_runner", None)
    if backends is None:
        flag, why = True, "no spec-v2 worker listing its attention backends"
    elif getattr(model_runner, "model_is_mrope", False):
        flag, why = True, "mrope model"
    else:
        flag = decide_needs_cpu_seq_lens(server_args, backends, piecewise_reads_mirror)
        why = "backends " + ", ".join(type(b).__name__ for b in backends if b is not None)
        if piecewise_reads_mirror and _piecewise_cuda_graph_on(server_args):
            why += "; piecewise CUDA graph on"
    set_needs_cpu_seq_lens(flag)
    import logging

    logging.getLogger(__name__).info("spec-v2 seq_lens CPU mirror %s (%s)", "kept" if flag else "skipped", why)
    return flag


# -- None-aware arithmetic on the mirror ---------------------------------------------


def add_or_none(value: Any, delta: Any) -> Any:
    """``value + delta``, or None when either is None (no mirror)."""
    if value is None or delta is None:
        return None
    return value + delta


def cat_or_none(first: Any, second: Any) -> Any:
    """``torch.cat([first, second])``, or None when either is None: a merged
    batch has a mirror only when both halves had one."""
    if first is None or second is None:
        return None
    import torch

    return torch.cat([first, second])


def index_or_none(tensor: Any, index: Any) -> Any:
    """``tensor[index]``, or None when there is no tensor."""
    return None if tensor is None else tensor[index]


def host_list_or_none(lens: Any) -> Optional[list]:
    """A host list of lengths as given; None for a device tensor (the GPU-only
    draft extend hands those over, and nothing copies them back)."""
    return lens if isinstance(lens, list) else None


# -- upper bounds where a size came from the mirror ------------------------------------


def rows_total_bound(batch: Any, rows: int, static: int) -> int:
    """A bound of the summed lengths of ``rows`` rows: ``rows * max_len`` of the
    batch's host bound (``seq_lens_host_bound``, runtime ``host_bound``: a row
    is a request, or one of its top-k branches, each no longer than the
    request's KV allocation), at most ``static`` (the ``rows * max_context_len``
    the caller used before); ``static`` for a batch without one."""
    bound = getattr(batch, "seq_lens_host_bound", None)
    return static if bound is None else min(static, rows * bound.max_len)


def seq_lens_sum_or_bound(seq_lens_sum: Optional[int], batch_size: int, max_context_len: int, batch: Any = None) -> int:
    """``seq_lens_sum``, or an upper bound without the mirror: ``batch_size``
    rows of the ``batch``'s host bound (``host_bound``), else of ``max_context_len``.

    Used to size (or slice) kv-index buffers that the kernels fill from the
    device seq_lens: over-allocating is safe, reading the device is a sync.
    """
    if seq_lens_sum is not None:
        return seq_lens_sum
    return rows_total_bound(batch, batch_size, batch_size * max_context_len)


def prefix_lens_sum_or_bound(
    extend_prefix_lens_cpu: Optional[Sequence[int]], batch_size: int, max_context_len: int, batch: Any = None
) -> int:
    """``sum(extend_prefix_lens_cpu)``, or the upper bound (as
    :func:`seq_lens_sum_or_bound`'s) when the GPU-only draft extend left the
    host list unset."""
    if extend_prefix_lens_cpu is None:
        return rows_total_bound(batch, batch_size, batch_size * max_context_len)
    return sum(extend_prefix_lens_cpu)


def max_of_extend_lens(extend_seq_lens_cpu: Optional[Sequence[int]], extend_seq_lens: Any) -> int:
    """``max(extend_seq_lens_cpu)``; without the host list, the device max
    (a defensive fallback: the draft extend always supplies the list)."""
    if extend_seq_lens_cpu is not None:
        return max(extend_seq_lens_cpu)
    return int(extend_seq_lens.max())


def tree_mask_seq_lens_sum(
    seq_lens_sum: Optional[int], tree_mask_buf: Any, seq_lens: Any, attn_backend: Any, batch: Any = None
) -> int:
    """The ``seq_lens_sum`` that ``build_tree_kernel_efficient`` sizes the
    verify tree mask with.

    With the mirror: the real sum. Without it, a preallocated mask (the kernel
    ignores the value): 0; otherwise an upper bound: the batch's host bound
    (``host_bound``), else ``batch size * max_context_len`` of the target
    backend (the kernel writes at offsets derived from the device seq_lens, so
    a larger mask is safe).
    """
    if seq_lens_sum is not None:
        return seq_lens_sum
    if tree_mask_buf is not None:
        return 0
    rows = seq_lens.shape[0]
    return rows_total_bound(batch, rows, rows * attn_backend.max_context_len)


def draft_extend_prefix_lens(seq_lens_cpu: Any, seq_lens: Any, num_draft_tokens: int) -> Any:
    """Prefix lengths of the spec-v2 draft extend (the lengths before the draft
    tokens): the host list with the mirror, else a device int32 tensor computed
    from ``seq_lens`` (already advanced by ``num_draft_tokens``), no copy."""
    if seq_lens_cpu is not None:
        return seq_lens_cpu.tolist()
    import torch

    return (seq_lens - num_draft_tokens).to(torch.int32)


# -- decode metrics --------------------------------------------------------------------


def decode_seq_lens(batch: Any) -> Iterable[int]:
    """Per-request sequence lengths of a decode batch, from the mirror when it
    is there, else from the requests (``req.seqlen``): never a device sync."""
    if batch.seq_lens_cpu is not None:
        return batch.seq_lens_cpu
    return [req.seqlen for req in batch.reqs]


def decode_total_seq_lens(batch: Any) -> int:
    """Total sequence length of a decode batch (see :func:`decode_seq_lens`)."""
    if batch.seq_lens_cpu is not None:
        return int(batch.seq_lens_cpu.sum().item())
    return sum(req.seqlen for req in batch.reqs)
