"""Run-time helpers for FlashInfer's (MHA) spec-v2 draft extend in a CUDA graph
(patch flashinfer-draft-extend-graph; upstream sglang 0.5.14).

0.5.4.post3 .. 0.5.12.post1's ``FlashInferAttnBackend`` has no CUDA-graph
metadata for ``DRAFT_EXTEND_V2`` (its capture raises on that mode) and the
spec-v2 worker never asks it for any: FlashInfer's draft extend runs eagerly
every step. The patched backend captures it here (``capture_draft_extend_v2``)
and replays it (``replay_draft_extend_v2``), as 0.5.14 does:

* a causal paged prefill over the whole sequence, no mask: every request
  runs the graph's fixed number of draft tokens (``stride``: the runner's
  ``num_tokens_per_bs``), so ``qo_indptr = [0, s, 2s, ...]`` and ``kv_indptr =
  cumsum(seq_lens)``. The release's own "normal extend" arrays give exactly
  that from ``prefix_lens = seq_lens - stride`` (``spec_info=None``: the spec
  inputs of these releases build a variable-width ``qo_indptr``);
* the replay plans without reading the device: the host arrays come from the
  CPU seq_lens mirror FlashInfer keeps (padded rows hold the fill value the
  device rows hold), handed to the prefill updater as flashinfer-host-indptr's
  ``host_plan``; each wrapper's ``begin_forward`` is, after the capture's real
  ``plan()``, ``sync_free_plan``: given host arrays it calls the wrapper's
  ``_cached_module.plan`` itself with them (upstream's ``fast_prefill_plan``),
  so neither ``plan()``'s ``.to("cpu")`` nor its copies of pageable host
  tensors run. It is installed only where, at capture, it reproduced the real
  ``plan()``'s ``_plan_info`` from the same arrays (a FlashInfer whose module
  takes other arguments keeps the stock ``plan()``).

Where a host array cannot be made equal to the device one (no mirror, a
mirror whose sum is not the batch's ``seq_lens_sum``, a sliding-window or
cross-attention backend), the stock plan runs from the device arrays.

**Off by default** (``SWITCH``): the worker admits FlashInfer to the
draft-extend graph only when ``PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1`` is in
the serving process's environment when it starts (read once, at the graph
check). On an H200 its outputs equal pristine's (2026-11-28f, g); its eager
batches are not yet shown at 0.98x pristine's speed (issue 71).

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

import os
from collections import namedtuple
from functools import partial

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "SWITCH",
    "admits_flashinfer_draft_extend",
    "capture_draft_extend_v2",
    "replay_draft_extend_v2",
    "replay_host_plan",
    "sync_free_plan",
]

#: "1" admits FlashInfer to the spec-v2 draft-extend CUDA graph (read at the worker's graph check).
SWITCH = "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH"
BACKEND = "FlashInferAttnBackend"
#: The backend's attribute holding each captured batch size's query stride.
STRIDES = "patchkit_draft_extend_strides"
#: A graph wrapper's attribute holding the replay's host plan while the updater plans it.
HOST = "patchkit_host_plan"

#: The replay's plan arrays on the host (int32 CPU tensors): the fields of flashinfer-host-indptr's
#: ``host_plan``, which its paged plan reads when both switches are on (2026-11-28f: a plan
#: without ``kv_lens`` raised at the first replay), the K lengths' sum and the K lengths.
HostPlan = namedtuple("HostPlan", ["qo_indptr", "kv_indptr", "last_page_len", "kv_len_sum", "kv_lens"])


def switched_on() -> bool:
    return os.environ.get(SWITCH, "") == "1"


#: The backend's methods the patch gives a DRAFT_EXTEND_V2 branch.
GRAPH_METHODS = ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph")


def admits_flashinfer_draft_extend(backend: object) -> bool:
    """Whether the worker captures ``backend``'s draft extend: the switch is on,
    its CUDA-graph metadata methods are ``FlashInferAttnBackend``'s own (a
    subclass that keeps them counts; TRT-LLM MHA, a subclass with its own, is
    not this patch's), with one wrapper (no sliding window, no cross
    attention) and prefill buffers."""
    if not switched_on() or backend is None:
        return False
    for name in GRAPH_METHODS:
        owner = next((cls for cls in type(backend).__mro__ if name in vars(cls)), None)
        if owner is None or owner.__name__ != BACKEND:
            return False
    return getattr(backend, "dispatch_reason", "unknown") is None and not getattr(backend, "skip_prefill", True)


def _host_tensor(values: Any) -> Any:
    """An int32 CPU tensor of ``values``, pinned where CUDA is there (copied
    to the device without waiting; torch's caching host allocator hands a
    pinned block out again only once the copies reading it ran)."""
    import torch

    values = torch.as_tensor(values, dtype=torch.int32)
    return values.pin_memory() if torch.cuda.is_available() else values.clone()


def _on_host(*tensors: Any) -> bool:
    import torch

    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors)


def capture_draft_extend_v2(
    backend: Any,
    bs: int,
    num_tokens: int,
    req_pool_indices: Any,
    seq_lens: Any,
    encoder_lens: Any,
    wrapper_cls: Any,
    metadata_cls: Any,
) -> Any:
    """Capture: one CUDA-graph paged prefill wrapper per backend wrapper on the
    graph buffers, planned once for real (capture may read the device, as the
    release's other captures do), kept in ``draft_extend_cuda_graph_metadata[bs]``;
    returns the forward metadata (``metadata_cls(wrappers, False, False)``)."""
    stride = num_tokens // bs
    wrappers = [
        wrapper_cls(
            backend.workspace_buffer,
            "NHD",
            backend=backend.prefill_backend,
            use_cuda_graph=True,
            qo_indptr_buf=backend.cuda_graph_qo_indptr[i][: bs + 1],
            paged_kv_indptr_buf=backend.kv_indptr[i][: bs + 1],
            paged_kv_indices_buf=backend.cuda_graph_kv_indices[i],
            paged_kv_last_page_len_buf=backend.kv_last_page_len[:bs],
        )
        for i in range(backend.num_wrappers)
    ]
    calls: list = []
    stock = [w.begin_forward for w in wrappers]
    for wrapper, plan in zip(wrappers, stock):
        wrapper.begin_forward = partial(_recorded, calls, wrapper, plan)
    seq_lens_cpu = seq_lens.cpu()
    backend.indices_updater_prefill.update(
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        int(seq_lens_cpu.sum()),
        prefix_lens=seq_lens - stride,
        prefill_wrappers=wrappers,
        use_ragged=False,
        encoder_lens=encoder_lens,
        spec_info=None,
    )
    for wrapper, plan in zip(wrappers, stock):
        wrapper.begin_forward = plan
    if backend.dispatch_reason is None:
        host = _plan_arrays(bs, stride, seq_lens_cpu)
        for wrapper, args, kwargs in calls:
            _install_sync_free_plan(wrapper, host, args, kwargs)
    metadata = getattr(backend, "draft_extend_cuda_graph_metadata", None)
    if metadata is None:  # declared (unused) in __init__ from 0.5.4; a fork may lack it
        metadata = {}
        backend.draft_extend_cuda_graph_metadata = metadata
    metadata[bs] = wrappers
    strides = getattr(backend, STRIDES, None)
    if strides is None:
        strides = {}
        setattr(backend, STRIDES, strides)
    strides[bs] = stride
    return metadata_cls(wrappers, False, False)


def _recorded(calls: list, wrapper: Any, plan: Any, *args: Any, **kwargs: Any) -> None:
    calls.append((wrapper, args, kwargs))
    plan(*args, **kwargs)


def _plan_arrays(bs: int, stride: int, lengths: Any) -> HostPlan:
    import torch

    lengths = lengths[:bs].to(torch.int64)
    kv = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, dim=0)])
    qo = torch.arange(0, (bs + 1) * stride, stride, dtype=torch.int64)
    ones = torch.ones(bs)
    return HostPlan(_host_tensor(qo), _host_tensor(kv), _host_tensor(ones), int(kv[-1]), _host_tensor(lengths))


def _install_sync_free_plan(wrapper: Any, host: HostPlan, args: tuple, kwargs: dict) -> None:
    """``wrapper.begin_forward`` becomes ``sync_free_plan`` if, fed the capture's
    arrays from the host, it gives the ``_plan_info`` the real ``plan()`` gave."""
    stock = wrapper.begin_forward
    planned = getattr(wrapper, "_plan_info", None)
    if planned is None or len(args) < 4:
        return
    try:
        done = _plan_from_host(
            wrapper, (host.qo_indptr, host.kv_indptr, args[2], host.last_page_len, *args[4:]), kwargs
        )
        same = done and list(wrapper._plan_info) == list(planned)
    except Exception:  # another FlashInfer's module: its stock plan() stays
        same = False
    if not same:
        wrapper._plan_info = planned
        stock(*args, **kwargs)  # the real plan's state back, as capture left it
        return
    wrapper.begin_forward = partial(sync_free_plan, wrapper, stock)


def sync_free_plan(wrapper: Any, stock: Any, *args: Any, **kwargs: Any) -> None:
    """A CUDA-graph paged prefill wrapper's plan: handed the replay's host plan
    (``replay_draft_extend_v2`` put it on the wrapper; flashinfer-host-indptr's
    ``paged_plan_from_host`` passes its ``qo_indptr``, ``kv_indptr`` and
    last-page lengths), FlashInfer's ``_cached_module.plan`` is called with
    them directly (what ``plan()`` computes from them, without its
    ``.to("cpu")`` and its copies of pageable tensors); anything else (the
    device arrays), the stock ``plan()``."""
    host = getattr(wrapper, HOST, None)
    ours = (
        host is not None
        and len(args) >= 4
        and args[0] is host.qo_indptr
        and args[1] is host.kv_indptr
        and args[3] is host.last_page_len
    )
    if not (ours and _plan_from_host(wrapper, args, kwargs)):
        stock(*args, **kwargs)


def _plan_from_host(wrapper: Any, args: tuple, kwargs: dict) -> bool:
    """What ``BatchPrefillWithPagedKVCacheWrapper.plan`` does at page size 1 in
    CUDA-graph mode for the fa2 backend, no mask, from host arrays. False
    (nothing done) for anything else: the stock plan then runs."""
    import torch

    if len(args) < 8:
        return False
    qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size = args[:8]
    batch_size = len(qo_indptr) - 1
    unsupported = {"custom_mask", "packed_custom_mask", "max_token_per_sequence", "max_sequence_kv"}
    if any(kwargs.get(name) is not None for name in unsupported) or len(args) > 8:
        return False
    given = kwargs.get("seq_lens")  # flashinfer-host-indptr hands the K lengths over (pinned)
    if given is not None and (not _on_host(given) or given.numel() != len(kv_indptr) - 1):
        return False
    if (
        page_size != 1
        or not getattr(wrapper, "is_cuda_graph_enabled", False)
        or getattr(wrapper, "_backend", None) != "fa2"
        or getattr(wrapper, "_cached_module", None) is None
        or batch_size != getattr(wrapper, "_fixed_batch_size", None)
        or len(kv_indptr) != batch_size + 1
        or len(last_page_len) != batch_size
        or len(kv_indices) > len(wrapper._paged_kv_indices_buf)
    ):
        return False
    total_rows = int(qo_indptr[-1])
    max_rows = wrapper._max_total_num_rows
    if max_rows is not None and total_rows > max_rows:
        return False
    if given is None:
        kv_lens = _host_tensor(torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + last_page_len)
    else:  # what plan() does with them: its K lengths, as they are
        kv_lens = given.flatten()
    if len(kv_lens) > wrapper._kv_lens_buffer.shape[0]:
        return False
    non_blocking = kwargs.get("non_blocking", True)
    wrapper._batch_size, wrapper._num_qo_heads, wrapper._num_kv_heads = batch_size, num_qo_heads, num_kv_heads
    wrapper._prefix_len_ptr = kwargs.get("prefix_len_ptr")
    wrapper._token_pos_in_items_ptr = kwargs.get("token_pos_in_items_ptr")
    wrapper._token_pos_in_items_len = kwargs.get("token_pos_in_items_len", 0)
    wrapper._max_item_len_ptr = kwargs.get("max_item_len_ptr")
    wrapper._qo_indptr_last = total_rows
    wrapper._max_q_len = int(torch.max(qo_indptr[1:] - qo_indptr[:-1])) if batch_size else 0
    wrapper._max_kv_len = int(torch.max(kv_lens)) if batch_size else 0
    wrapper._kv_lens_buffer[: len(kv_lens)].copy_(kv_lens, non_blocking=non_blocking)
    if max_rows is None:
        wrapper._max_total_num_rows = total_rows
    wrapper._qo_indptr_buf.copy_(qo_indptr, non_blocking=non_blocking)
    wrapper._paged_kv_indptr_buf.copy_(kv_indptr, non_blocking=non_blocking)
    wrapper._paged_kv_last_page_len_buf.copy_(last_page_len, non_blocking=non_blocking)
    wrapper._paged_kv_indices_buf[: len(kv_indices)].copy_(
        kv_indices, non_blocking=(kv_indices.device == wrapper._paged_kv_indices_buf.device) and non_blocking
    )
    head_dim_vo = kwargs.get("head_dim_vo") or head_dim
    wrapper._plan_info = wrapper._cached_module.plan(
        wrapper._float_workspace_buffer,
        wrapper._int_workspace_buffer,
        wrapper._pin_memory_int_workspace_buffer,
        qo_indptr,
        kv_indptr,
        kv_lens,
        wrapper._max_total_num_rows or total_rows,
        batch_size,
        num_qo_heads,
        num_kv_heads,
        page_size,
        wrapper.is_cuda_graph_enabled,
        head_dim,
        head_dim_vo,
        kwargs.get("causal", False),
        kwargs.get("window_left", -1),
        kwargs.get("fixed_split_size") or -1,
        kwargs.get("disable_split_kv", False),
        0,  # num_colocated_ctas
    )
    return True


def replay_host_plan(backend: Any, bs: int, seq_lens_cpu: Any, seq_lens_sum: Any) -> Any:
    """The replay's plan arrays from the (padded) mirror: ``[0, s, 2s, ...]``
    and ``cumsum(seq_lens)``, what the device builds from ``prefix_lens =
    seq_lens - s``. None without the mirror, when its sum is not the batch's
    ``seq_lens_sum`` (a stale buffer) or for a backend with two wrappers."""
    stride = (getattr(backend, STRIDES, None) or {}).get(bs)
    if stride is None or getattr(backend, "dispatch_reason", "unknown") is not None:
        return None
    if seq_lens_cpu is None or not _on_host(seq_lens_cpu) or seq_lens_cpu.shape[0] < bs or seq_lens_sum is None:
        return None
    import torch

    if int(seq_lens_cpu[:bs].to(torch.int64).sum()) != int(seq_lens_sum):
        return None
    return _plan_arrays(bs, stride, seq_lens_cpu)


def replay_draft_extend_v2(
    backend: Any,
    bs: int,
    req_pool_indices: Any,
    seq_lens: Any,
    seq_lens_sum: Any,
    encoder_lens: Any,
    seq_lens_cpu: Any,
) -> None:
    """Replay: the captured wrappers re-planned for this batch (its padded
    buffers), from the mirror where it matches (``replay_host_plan``), else
    from the device arrays as the stock plan does."""
    stride = getattr(backend, STRIDES)[bs]
    wrappers = backend.draft_extend_cuda_graph_metadata[bs]
    host = replay_host_plan(backend, bs, seq_lens_cpu, seq_lens_sum)
    for wrapper in wrappers:
        setattr(wrapper, HOST, host)
    try:
        _replan(
            backend, bs, stride, wrappers, host, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, seq_lens_cpu
        )
    finally:
        for wrapper in wrappers:
            setattr(wrapper, HOST, None)


def _replan(
    backend: Any,
    bs: int,
    stride: int,
    wrappers: list,
    host: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    seq_lens_sum: Any,
    encoder_lens: Any,
    seq_lens_cpu: Any,
) -> None:
    backend.indices_updater_prefill.update(
        req_pool_indices[:bs],
        seq_lens[:bs],
        seq_lens_cpu[:bs] if seq_lens_cpu is not None else None,
        seq_lens_sum,
        prefix_lens=seq_lens[:bs] - stride,
        prefill_wrappers=wrappers,
        use_ragged=False,
        encoder_lens=encoder_lens[:bs] if encoder_lens is not None else None,
        spec_info=None,
        host_plan=host,
    )
