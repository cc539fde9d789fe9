"""Run-time helpers for the FlashInfer MLA host plan (sglang #27689, 0.5.18).

``BatchMLAPagedAttentionWrapper.plan`` schedules its work on the host: it
copies ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` to the CPU
(``.to("cpu")`` three times) and hands the host arrays to the planner. Given
device tensors, each copy makes the host wait for everything queued on the
stream. The spec-v2 target verify (its CUDA-graph replay and, past the
captured sizes, its eager run), the eager draft decode and the eager draft
extend (``DRAFT_EXTEND_V2``) handed it device tensors every step, although
each of those arrays is known on the host: the verify's from the CPU seq_lens
mirror and the draft-token count, the draft decode's from the mirror, the
draft extend's from the mirror and the batch's host extend lengths. These
helpers build them in pinned host tensors, and ``fast_mla_prefill_plan`` is
the verify wrapper's plan without the copies. Upstream (0.5.18 .. 0.5.23)
still plans the eager verify and draft decode from the device: 2026-11-28g
counted 9 waits a decode step there on an H200 (docs/gpu.md).

Each helper returns ``(None, None, None)`` when a host array it needs is not
there: the caller then plans from the device tensors, as before.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = [
    "draft_decode_planned",
    "draft_extend_host_plan",
    "eager_verify_host_plan",
    "fast_mla_prefill_plan",
    "verify_host_plan",
]

_NONE = (None, None, None)


def _host_plan(qo_lens: Any, kv_lens: Any) -> tuple:
    """``(qo_indptr, kv_indptr, kv_len_arr)``, int32 on the host, pinned where
    CUDA is there: three views of one fresh allocation a plan (2026-11-29: a
    pinned allocation for each array made host work in a host-bound eager
    step). Fresh each step, not a reused buffer: the plan copies them to the
    device without waiting (``non_blocking``), and torch's caching host
    allocator hands a pinned block out again only once the copies that read
    it have run, so a later step never overwrites bytes a queued copy has yet
    to read."""
    import torch

    bs = len(kv_lens)
    fresh = torch.zeros((3 * bs + 2,), dtype=torch.int32, pin_memory=torch.cuda.is_available())
    qo_indptr, kv_indptr, kv_len_arr = fresh[: bs + 1], fresh[bs + 1 : 2 * bs + 2], fresh[2 * bs + 2 :]
    kv_len_arr.copy_(kv_lens)
    torch.cumsum(torch.as_tensor(qo_lens, dtype=torch.int32), dim=0, out=qo_indptr[1:])
    torch.cumsum(kv_len_arr, dim=0, out=kv_indptr[1:])
    return qo_indptr, kv_indptr, kv_len_arr


def verify_host_plan(seq_lens_cpu: Any, bs: int, draft_token_num: Optional[int]) -> tuple:
    """The target verify's plan arrays on the host: ``draft_token_num`` query
    rows per request, K lengths ``seq_lens + draft_token_num``: what
    ``generate_attn_arg_prefill`` builds on the device from the same lengths
    (``seq_lens_cpu`` is the replay's, padded rows included).
    ``(None, None, None)`` without the mirror."""
    if seq_lens_cpu is None or draft_token_num is None or int(draft_token_num) <= 0:
        return _NONE
    if seq_lens_cpu.shape[0] < bs:
        return _NONE
    import torch

    n = int(draft_token_num)
    return _host_plan([n] * bs, seq_lens_cpu[:bs].to(torch.int32) + n)


def _mirror_of(forward_batch: Any) -> Any:
    """The batch's CPU seq_lens mirror, one length a request; None when it is
    missing, on the device, or of another length than the batch."""
    import torch

    seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    if not isinstance(seq_lens_cpu, torch.Tensor) or seq_lens_cpu.device.type != "cpu":
        return None
    return seq_lens_cpu if seq_lens_cpu.shape[0] == forward_batch.batch_size else None


def eager_verify_host_plan(forward_batch: Any) -> tuple:
    """The eager target verify's plan arrays on the host (a batch past the
    captured sizes): ``verify_host_plan`` from the batch's own mirror.
    ``(None, None, None)`` without it."""
    mirror = _mirror_of(forward_batch)
    if mirror is None:
        return _NONE
    return verify_host_plan(mirror, mirror.shape[0], getattr(forward_batch.spec_info, "draft_token_num", None))


class _HostPlannedDecode:
    """A decode wrapper whose ``plan()`` gets the host arrays in place of the
    device ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` it is handed (the
    same numbers: ``draft_decode_planned``); everything else is passed on to
    the wrapper, whose state the plan sets."""

    def __init__(self, wrapper: Any, host: tuple) -> None:
        self.wrapper, self.host = wrapper, host

    def plan(self, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, *rest: Any, **kw: Any) -> Any:
        qo_host, kv_host, len_host = self.host
        if len(qo_indptr) != len(qo_host) or len(kv_len_arr) != len(len_host):  # not the batch it was built for
            return self.wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, *rest, **kw)
        return self.wrapper.plan(qo_host, kv_host, kv_indices, len_host, *rest, **kw)


def draft_decode_planned(wrapper: Any, forward_batch: Any) -> Any:
    """The decode wrapper to hand the decode updater: for an eager spec-v2
    draft decode step (a draft input, past the captured sizes) one that plans
    from host arrays built from the mirror: one query row a request, K lengths
    ``seq_lens``, what the updater builds on the device for that branch
    (``q_indptr`` is ``arange``, ``kv_indptr`` the cumsum of ``seq_lens``;
    sglang's own draft-decode replay plans from the same mirror arrays).
    ``wrapper`` itself for any other batch or without the mirror."""
    spec = getattr(forward_batch, "spec_info", None)
    is_draft = getattr(spec, "is_draft_input", None)
    mirror = _mirror_of(forward_batch) if callable(is_draft) and is_draft() else None
    if mirror is None:
        return wrapper
    import torch

    return _HostPlannedDecode(wrapper, _host_plan([1] * mirror.shape[0], mirror.to(torch.int32)))


def draft_extend_host_plan(forward_batch: Any, use_ragged: bool) -> tuple:
    """The eager draft extend's (``DRAFT_EXTEND_V2``) plan arrays on the
    host: each request's query rows are its host extend length (the device
    ``qo_indptr`` is the cumsum of ``seq_lens - prefix_lens``, the same
    numbers), its K length the mirror (``seq_lens``, the window already
    added). ``(None, None, None)`` for any other batch, a ragged plan, or
    when either host list is missing or they disagree in length."""
    if use_ragged or not forward_batch.forward_mode.is_draft_extend_v2():
        return _NONE
    seq_lens_cpu = forward_batch.seq_lens_cpu
    extend_lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    if seq_lens_cpu is None or extend_lens is None or len(extend_lens) != seq_lens_cpu.shape[0]:
        return _NONE
    import torch

    on_device = [t for t in (seq_lens_cpu, extend_lens) if isinstance(t, torch.Tensor) and t.device.type != "cpu"]
    if on_device:  # a GPU-only draft extend (lengths handed over on the device): no host plan
        return _NONE
    return _host_plan([int(n) for n in extend_lens], seq_lens_cpu.to(torch.int32))


def _host(tensor: Any) -> Any:
    """``tensor`` on the host: as given when it is there (no copy, no wait);
    a device tensor is copied as the stock ``plan()`` copies it."""
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")


def fast_mla_prefill_plan(
    self: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_len_arr: Any,
    num_heads: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    q_data_type: Any,
    kv_data_type: Any,
) -> None:
    """``BatchMLAPagedAttentionWrapper.plan`` for a CUDA-graph verify wrapper
    already planned once (at capture, which compiled its module), from host
    arrays: the graph's bound buffers are refreshed as the stock plan's
    CUDA-graph branch refreshes them (non-blocking copies), and the host
    planner gets the host arrays as they are, so nothing waits for the GPU.
    Device arrays (no mirror) are copied to the host first, as the stock
    plan does."""
    qo_host, kv_host, len_host = _host(qo_indptr), _host(kv_indptr), _host(kv_len_arr)
    self._causal = causal
    self._page_size = page_size
    self._sm_scale = sm_scale
    self._qo_indptr_buf.copy_(qo_indptr, non_blocking=True)
    self._kv_indptr_buf.copy_(kv_indptr, non_blocking=True)
    self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices, non_blocking=True)
    self._kv_len_arr_buf.copy_(kv_len_arr, non_blocking=True)
    # The plan's result is not kept, as sglang's fast_mla_decode_plan keeps
    # none: the captured graph launched with the capture's; the planner
    # refreshes the workspace the graph reads.
    self._cached_module.plan(
        self._float_workspace_buffer,
        self._int_workspace_buffer,
        self._pin_memory_int_workspace_buffer,
        qo_host,
        kv_host,
        len_host,
        num_heads,
        head_dim_ckv,
        causal,
    )
