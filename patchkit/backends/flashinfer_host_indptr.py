"""Run-time helpers for the FlashInfer (MHA) host indptrs (issue 71).

FlashInfer's ``plan()`` schedules on the host: the paged prefill plan copies
``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len`` to the CPU
(``.to("cpu")``), packs a custom mask with ``segment_packbits`` (one
``.item()``), the ragged plan copies its two indptrs, the decode plan its
indptr and last-page lengths. Given device tensors, each copy makes the host
wait for everything queued on the stream. In the spec-v2 step the arrays are
known on the host, from the CPU seq_lens mirror FlashInfer keeps:

* the target verify (EAGLE): ``draft_token_num`` query rows a request, K
  lengths ``seq_lens + draft_token_num`` (``verify_host_plan``);
* the eager draft extend (``DRAFT_EXTEND_V2``): the host prefix lengths and
  the mirror (``draft_extend_host_plan``);
* the multi-step draft decode: the indptr ``generate_draft_decode_kv_indices``
  writes, from the mirror and the draft's positions (``draft_host_indptr``).

Each host array holds exactly the numbers the device one holds, CUDA-graph
padding included, so every value ``plan()`` computes is unchanged. Host
arrays sent to the device are pinned, those ``plan()`` makes itself too (the
paged plans' K lengths handed over as ``seq_lens``, the decode plan's cached
``qo_indptr`` range): a non-blocking copy from pageable memory waits. Where a
host array cannot be made exactly so, the helper returns None and the stock
plan runs from the device tensors.

**Off by default** (``SWITCH``): upstream ships its own two host plans off
(0.5.23's ``SGLANG_OPT_FLASHINFER_*`` opt-ins); on an H200 (2026-11-28d .. g)
this tree's outputs equal pristine's at every batch size, but its eager
batches are not yet shown at 0.98x pristine's speed (issue 71, docs/gpu.md).
Until they are, every helper returns None (the stock plans) unless
``PATCHKIT_FLASHINFER_HOST_INDPTR=1`` is in the serving process's environment.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

import inspect
import os
from collections import namedtuple
from functools import partial

from .mask_bits import pack_mask_segments

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "PrefillHostPlan",
    "decode_plan_from_host",
    "draft_extend_host_plan",
    "draft_host_indptr",
    "pack_mask_segments",
    "paged_plan_from_host",
    "ragged_plan_from_host",
    "verify_host_plan",
]

#: "1" turns the host plans on (read at every plan: the GPU run flips it per engine).
SWITCH = "PATCHKIT_FLASHINFER_HOST_INDPTR"


def switched_on() -> bool:
    return os.environ.get(SWITCH, "") == "1"


#: A prefill plan's host arrays (int32 CPU tensors: the K lengths too) and the K lengths' sum.
PrefillHostPlan = namedtuple("PrefillHostPlan", ["qo_indptr", "kv_indptr", "last_page_len", "kv_len_sum", "kv_lens"])


def _fresh_host_int32(n: int) -> tuple:
    """A new int32 host tensor of ``n`` values and its numpy view, which the builders fill
    (numpy's microseconds where small torch CPU ops cost several times that: 2026-11-29's
    profile read 13 ``pin_memory`` calls and about 40 torch ops a step, 7% of a host-bound
    eager step). Pinned where CUDA is there: the plan copies it without waiting, and torch's
    caching host allocator hands a pinned block out again only once the copies reading it
    ran, so no later step overwrites bytes a queued copy has yet to read."""
    import torch

    fresh = torch.empty(n, dtype=torch.int32, pin_memory=torch.cuda.is_available())
    return fresh, fresh.numpy()


_CONSTANTS: dict = {}  # (n, step) -> a host tensor nothing writes after it is made


def _constant_range(n: int, step: int) -> Any:
    """``[0, step, 2 * step, ...]`` (``n`` values), or ``n`` ones where ``step`` is 0, as a
    host tensor made once for each ``(n, step)``: the verify's ``qo_indptr`` and the
    last-page lengths (page size 1) are the same numbers every step, and bytes that never
    change may be read by any number of queued copies."""
    if (n, step) not in _CONSTANTS:
        fresh, values = _fresh_host_int32(n)
        values[:] = 1 if step == 0 else range(0, n * step, step)
        _CONSTANTS[n, step] = fresh
    return _CONSTANTS[n, step]


def _lengths(values: Any) -> Any:
    """A host tensor or sequence of lengths as an int64 numpy array (a copy: callers add to it)."""
    import numpy as np

    return np.array(values.numpy() if hasattr(values, "numpy") else values, dtype=np.int64)


def _on_host(*tensors: Any) -> bool:
    import torch

    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors)


def _plan(qo_lens: Any, kv_lens: Any, qo_step: int = 0) -> PrefillHostPlan:
    """The host arrays of the K lengths ``kv_lens`` and the query lengths ``qo_lens``
    (int64 numpy), or ``qo_step`` query rows each (the verify: its indptr is a constant):
    the indptrs and the K lengths in one fresh allocation, the last-page ones a constant."""
    import numpy as np

    bs = len(kv_lens)
    parts = [[0], kv_lens.cumsum(), kv_lens] + ([] if qo_step else [[0], qo_lens.cumsum()])
    fresh, values = _fresh_host_int32(sum(map(len, parts)))
    values[:] = np.concatenate(parts)
    qo_indptr = _constant_range(bs + 1, qo_step) if qo_step else fresh[2 * bs + 1 :]
    last_page = _constant_range(bs, 0)
    return PrefillHostPlan(qo_indptr, fresh[: bs + 1], last_page, int(values[bs]), fresh[bs + 1 : 2 * bs + 1])


def _single_wrapper(backend: Any) -> bool:
    # Sliding-window and cross-attention backends plan other K lengths (the
    # window's, the encoder's): their plans keep the device arrays.
    return getattr(backend, "dispatch_reason", "unknown") is None


def verify_host_plan(backend: Any, spec_info: Any, seq_lens_cpu: Any, bs: int, seq_lens_sum: Any) -> Any:
    """The EAGLE target verify's plan arrays on the host: what
    ``EagleVerifyInput.generate_attn_arg_prefill`` builds on the device,
    ``qo_indptr = [0, n, 2n, ...]`` and ``kv_indptr = cumsum(seq_lens + n)``
    (``n = draft_token_num``). ``seq_lens_cpu`` is the replay's buffer, its
    padded rows filled with the value the device rows are filled with. None
    for another spec input, without the mirror, or when the mirror's sum is
    not the batch's ``seq_lens_sum`` (a stale buffer: the device arrays then)."""
    if not switched_on():
        return None
    kind = getattr(getattr(spec_info, "spec_input_type", None), "name", None)
    n = getattr(spec_info, "draft_token_num", None)
    if kind != "EAGLE_VERIFY" or not isinstance(n, int) or n <= 0 or not _single_wrapper(backend):
        return None
    if not _on_host(seq_lens_cpu) or seq_lens_cpu.shape[0] < bs or seq_lens_sum is None:
        return None
    lengths = _lengths(seq_lens_cpu[:bs])
    if int(lengths.sum()) != int(seq_lens_sum):
        return None
    return _plan(None, lengths + n, qo_step=n)


def draft_extend_host_plan(backend: Any, forward_batch: Any, use_ragged: bool) -> Any:
    """The eager ``DRAFT_EXTEND_V2``'s plan arrays on the host. The device
    builds ``qo_indptr = cumsum(seq_lens - prefix_lens)`` and ``kv_indptr =
    cumsum(prefix_lens)`` (ragged: the cached part is the prefix) or
    ``cumsum(seq_lens)``; the host has both lengths: the mirror and
    ``extend_prefix_lens_cpu`` (the list the device prefix lengths were made
    from). None for any other batch or without either host list."""
    if not switched_on():
        return None
    if not forward_batch.forward_mode.is_draft_extend_v2() or not _single_wrapper(backend):
        return None
    seq_lens_cpu = forward_batch.seq_lens_cpu
    prefix = getattr(forward_batch, "extend_prefix_lens_cpu", None)
    if not _on_host(seq_lens_cpu) or prefix is None or len(prefix) != seq_lens_cpu.shape[0]:
        return None
    import torch

    if isinstance(prefix, torch.Tensor) and prefix.device.type != "cpu":
        return None
    seq_lens = _lengths(seq_lens_cpu)
    if forward_batch.seq_lens_sum is None or int(seq_lens.sum()) != int(forward_batch.seq_lens_sum):
        return None
    prefix = _lengths(prefix)
    return _plan(seq_lens - prefix, prefix if use_ragged else seq_lens)


def draft_host_indptr(forward_batch: Any, topk: int, num_steps: int) -> Any:
    """The multi-step draft's ``kv_indptr`` for every step, on the host:
    ``generate_draft_decode_kv_indices`` writes ``indptr[s][r] = sum(positions[:r])
    + r * (s + 1)`` for the ``num_seqs * topk`` rows (``indptr[s][0]`` stays 0).
    A live row's position is its request's length (``seq_lens`` repeated
    ``topk`` times, the draft input's ``positions``); a CUDA graph's padded
    rows read the runner's positions buffer, zeroed when it pads, while their
    mirror rows hold the fill value: they count 0 here, as on the device.
    None without the mirror or the draft's positions (capture builds none:
    it keeps the device copy)."""
    if not switched_on():
        return None
    seq_lens_cpu = forward_batch.seq_lens_cpu
    positions = getattr(forward_batch.spec_info, "positions", None)
    num_seqs = forward_batch.batch_size
    if not _on_host(seq_lens_cpu) or positions is None or seq_lens_cpu.shape[0] != num_seqs or topk <= 0:
        return None
    live = int(positions.shape[0])  # shape only: a host number
    if live % topk or live > num_seqs * topk:
        return None
    seq_lens = _lengths(seq_lens_cpu)
    live_sum = forward_batch.seq_lens_sum
    if live_sum is None or int(seq_lens[: live // topk].sum()) != int(live_sum):
        return None
    import numpy as np

    rows = np.repeat(seq_lens, topk)
    rows[live:] = 0  # padded rows: the runner zeroed their positions
    width = len(rows) + 1
    fresh, values = _fresh_host_int32(num_steps * width)
    grid = values.reshape(num_steps, width)
    grid[:, 0] = 0
    grid[:, 1:] = rows.cumsum()
    grid += np.arange(1, num_steps + 1)[:, None] * np.arange(width)[None, :]
    return fresh.view(num_steps, width)


def decode_plan_from_host(wrapper: Any, host_indptr: Any) -> Callable:
    """``wrapper.begin_forward``, fed ``host_indptr`` (the multi-step draft's
    host copy of the indptr it plans, the override sglang gives
    ``fast_decode_plan``) and host last-page lengths instead of the device
    tensors: the stock plan's two ``.to("cpu")`` then copy nothing."""
    if host_indptr is None:
        return wrapper.begin_forward
    return partial(_decode_from_host, wrapper, host_indptr)


def _decode_from_host(
    wrapper: Any, host_indptr: Any, indptr: Any, indices: Any, last_page_len: Any, *args: Any, **kwargs: Any
) -> None:
    if len(args) < 4 or args[3] != 1 or len(host_indptr) != len(indptr):  # page size 1: every last page holds 1
        return wrapper.begin_forward(indptr, indices, last_page_len, *args, **kwargs)
    if not getattr(wrapper, "is_cuda_graph_enabled", True):  # a graph's plan sends no range
        _pin_range(len(indptr))
    return wrapper.begin_forward(host_indptr, indices, _host_ones(len(last_page_len)), *args, **kwargs)


def _pin_range(n: int) -> None:
    """The eager decode plan sends ``qo_indptr = arange(n)`` from FlashInfer's own cached CPU
    range (``flashinfer.utils._get_range_buf(n, "cpu")``), made in pageable memory: a
    non-blocking copy from it waits (2026-11-28e counted one a draft decode step). The range is
    constant, so the cached buffer is replaced once by the same numbers in pinned memory; the
    plan then sends it without waiting. A FlashInfer without that cache is left alone."""
    import torch

    try:
        from flashinfer import utils
    except ImportError:
        return
    get, cache = getattr(utils, "_get_range_buf", None), getattr(utils, "_cache_buf", None)
    if get is None or not isinstance(cache, dict) or not torch.cuda.is_available():
        return
    size = 1 << (n - 1).bit_length()  # the power of two the cache is keyed by
    key = (f"range_{size}", "cpu")
    if key not in cache or not cache[key].is_pinned():
        cache[key] = torch.arange(size, dtype=torch.int32).pin_memory()


def _with_kv_lens(wrapper: Any, host: Any, kwargs: dict) -> dict:
    """``kwargs`` plus ``seq_lens=`` the host K lengths (pinned), where the wrapper's plan takes
    them (FlashInfer's documented argument) and plans with FA2 / FA3: else ``plan()`` makes the
    K lengths on the host in pageable memory and sends them with a copy that waits (2026-11-28e:
    one a paged plan). The same numbers ``plan()`` would make (page size 1)."""
    lens = getattr(host, "kv_lens", None)  # a host plan another module built may not carry them
    if lens is None or "seq_lens" in kwargs or getattr(wrapper, "_backend", "auto") not in ("auto", "fa2", "fa3"):
        return kwargs
    if not _takes_seq_lens(type(wrapper)):
        return kwargs
    return {**kwargs, "seq_lens": lens}


_TAKES_SEQ_LENS: dict = {}  # plan() signatures, by wrapper class


def _takes_seq_lens(cls: Any) -> bool:
    if cls not in _TAKES_SEQ_LENS:
        plan = getattr(cls, "plan", None)
        try:
            _TAKES_SEQ_LENS[cls] = plan is not None and "seq_lens" in inspect.signature(plan).parameters
        except (TypeError, ValueError):
            _TAKES_SEQ_LENS[cls] = False
    return _TAKES_SEQ_LENS[cls]


def _host_ones(n: int) -> Any:
    """``n`` ones on the host: sglang's FlashInfer ``kv_last_page_len`` (page size 1, never written)."""
    return _constant_range(n, 0)


def ragged_plan_from_host(wrapper: Any, host_plan: Any) -> Callable:
    """``wrapper.begin_forward`` of the ragged (extend part) wrapper, fed the
    host ``qo_indptr`` for both its indptrs, as sglang hands it the device one."""
    if host_plan is None:
        return wrapper.begin_forward
    return partial(_ragged_from_host, wrapper, host_plan)


def _ragged_from_host(wrapper: Any, host_plan: Any, qo_indptr: Any, kv_indptr: Any, *args: Any, **kwargs: Any) -> None:
    if kv_indptr is not qo_indptr or kwargs.get("custom_mask") is not None:
        return wrapper.begin_forward(qo_indptr, kv_indptr, *args, **kwargs)
    return wrapper.begin_forward(host_plan.qo_indptr, host_plan.qo_indptr, *args, **kwargs)


def paged_plan_from_host(wrapper: Any, host_plan: Any) -> Callable:
    """``wrapper.begin_forward`` of a paged prefill wrapper, fed the host
    ``qo_indptr``, ``kv_indptr`` and last-page lengths. A custom mask (the
    verify's tree mask) is packed on the device here instead of in
    ``plan()``: FlashInfer's ``segment_packbits`` reads its total with
    ``.item()`` and needs device indptrs; the packed bytes and their indptr
    are the same, and go where ``plan()`` puts them."""
    if host_plan is None:
        return wrapper.begin_forward
    return partial(_paged_from_host, wrapper, host_plan)


def _paged_from_host(
    wrapper: Any,
    host: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    last_page_len: Any,
    *args: Any,
    custom_mask: Any = None,
    **kwargs: Any,
) -> None:
    stock = len(args) < 4 or args[3] != 1 or len(host.qo_indptr) != len(qo_indptr)
    if custom_mask is not None:
        # Installed after plan(): only a wrapper whose backend is fixed (not
        # "auto", chosen by whether a mask is set) and, under a CUDA graph,
        # that owns the mask buffers (else plan() raises, as it should).
        graph = wrapper.is_cuda_graph_enabled
        buffers = all(hasattr(wrapper, name) for name in ("_custom_mask_buf", "_mask_indptr_buf"))
        stock = stock or getattr(wrapper, "_backend", "auto") == "auto" or not buffers
        stock = stock or (graph and (wrapper._custom_mask_buf is None or wrapper._mask_indptr_buf is None))
        stock = stock or kwargs.get("packed_custom_mask") is not None
    if stock:
        return wrapper.begin_forward(
            qo_indptr, kv_indptr, kv_indices, last_page_len, *args, custom_mask=custom_mask, **kwargs
        )
    wrapper.begin_forward(
        host.qo_indptr, host.kv_indptr, kv_indices, host.last_page_len, *args, **_with_kv_lens(wrapper, host, kwargs)
    )
    if custom_mask is None:
        return None
    # plan()'s _compute_page_mask_indptr at page size 1: qo_len * kv_len bits a request.
    qo_lens = (host.qo_indptr[1:] - host.qo_indptr[:-1]).long()
    kv_lens = (host.kv_indptr[1:] - host.kv_indptr[:-1]).long()
    packed, byte_indptr = pack_mask_segments(custom_mask, qo_lens * kv_lens)
    if wrapper.is_cuda_graph_enabled:
        wrapper._custom_mask_buf[: len(packed)].copy_(packed, non_blocking=True)
        wrapper._mask_indptr_buf.copy_(byte_indptr, non_blocking=True)
    else:
        wrapper._custom_mask_buf = packed
        wrapper._mask_indptr_buf = byte_indptr.to(packed.device, non_blocking=True)
    return None

