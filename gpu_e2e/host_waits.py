"""Host waits counted the way torch counts them (issue 53), beside the wrapper counter.

Two counters, installed by :func:`syncs.install` in every sglang process:

* **torch's sync debug mode.** ``torch.cuda.set_sync_debug_mode("warn")`` makes torch
  warn "called a synchronizing CUDA operation" at every operation it instruments
  (``.item()``, ``.cpu()``, ``nonzero``, a boolean-mask index, ``repeat_interleave``
  without ``output_size``, a blocking copy in either direction, ``torch.tensor(list,
  device="cuda")``, ``Stream.synchronize``, ``torch.cuda.synchronize``, ...). Each warning
  becomes a count, kind ``sync``, at its call site (the innermost ``sglang/`` frame, as
  for the wrapper counter). The mode is armed through ``torch._C._cuda_set_sync_debug_mode``,
  which sets a process-wide flag without creating a CUDA context (``set_sync_debug_mode``
  itself would start one in every process, the tokenizer's included). Python's warning
  filters would show a warning once per place: the harness keeps an "always" filter for
  this text first in the list, and counts at ``warnings._showwarnmsg``, below
  ``catch_warnings``' replacements, so a library's own filters cannot hide one.
  Not instrumented by torch: ``torch.cuda.Event.synchronize`` (the wrapper counter's
  ``wait`` kind still counts it) and what a kernel library syncs in its own C++.
* **the pageable-copy check.** A CPU -> CUDA copy whose source is unpinned, not dense,
  or of another dtype (torch converts it on the host first) goes through pageable
  memory, which the driver stages: with ``non_blocking=True`` torch says nothing.
  ``Tensor.to``, ``Tensor.cuda``, ``Tensor.copy_`` and ``torch.tensor`` /
  ``torch.as_tensor`` with a CUDA device and host data are checked: kind ``h2d`` when
  the copy was blocking anyway (torch's warning counts it too), ``h2d-nb`` when
  ``non_blocking`` was passed (torch is silent: only this check sees it).

A site's **host waits** are its ``sync`` count plus its ``h2d-nb`` count (a blocking
pageable copy is in ``sync`` already): :func:`blocking_count`.

Pure functions (:func:`is_sync_warning`, :func:`staging_reason`, :func:`copy_kind`,
:func:`to_target`, :func:`blocking_count`) are tested on CPU; :func:`install` on CPU
wraps the copies (the warning never comes without CUDA) and on a GPU in tests/gpu.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Optional

SYNC = "sync"
H2D = "h2d"
H2D_NB = "h2d-nb"
KINDS = (SYNC, H2D, H2D_NB)
#: The text of torch's warning (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync).
WARNING_TEXT = "called a synchronizing CUDA operation"

_local = threading.local()


def is_sync_warning(message: Any) -> bool:
    """True for torch's sync debug warning (a Warning instance or its text)."""
    return str(message).startswith(WARNING_TEXT)


def staging_reason(*, pinned: bool, dense: bool, same_dtype: bool) -> Optional[str]:
    """Why a CPU -> CUDA copy goes through pageable memory, or None when it needs not:
    torch copies a non-dense or converted source into a new (unpinned) host tensor first."""
    if not dense:
        return "non-dense"
    if not same_dtype:
        return "converted"
    if not pinned:
        return "unpinned"
    return None


def copy_kind(reason: Optional[str], non_blocking: bool) -> Optional[str]:
    """``h2d`` (blocking: torch warns too), ``h2d-nb`` (non_blocking: torch is silent)."""
    if reason is None:
        return None
    return H2D_NB if non_blocking else H2D


def blocking_count(kinds: Mapping[str, int]) -> int:
    """Host waits at one site from its counts by kind (see the module doc)."""
    return int(kinds.get(SYNC, 0)) + int(kinds.get(H2D_NB, 0))


def device_type(device: Any) -> Optional[str]:
    """``"cuda:0"`` / ``torch.device("cuda")`` / ``0`` -> ``"cuda"``; None -> None."""
    if device is None:
        return None
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return "cuda"
    kind = getattr(device, "type", None)
    if kind is not None:
        return kind
    return str(device).split(":", 1)[0]


def to_target(args: tuple, kwargs: Mapping, torch: Any) -> tuple[Optional[str], Any, bool]:
    """(device type, dtype, non_blocking) of a ``Tensor.to`` call, from any of its forms:
    ``to(device, dtype, non_blocking, copy)``, ``to(dtype, non_blocking, copy)``,
    ``to(other, non_blocking, copy)``, keywords."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    flags = []
    for a in args:
        if isinstance(a, torch.Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, bool):
            flags.append(a)
        elif isinstance(a, (str, int, torch.device)):
            device = a
    non_blocking = bool(kwargs.get("non_blocking", flags[0] if flags else False))
    return device_type(device), dtype, non_blocking


# ------------------------------------------------------------------- installing


def _compiling(torch: Any) -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def _check_copy(
    torch: Any, count: Callable, src: Any, dst_dtype: Any, non_blocking: bool, dst_shape: Any = None
) -> None:
    if src.numel() == 0:
        return
    dense = src.is_contiguous() and (dst_shape is None or tuple(src.shape) == tuple(dst_shape))
    reason = staging_reason(pinned=src.is_pinned(), dense=dense, same_dtype=dst_dtype is None or src.dtype == dst_dtype)
    kind = copy_kind(reason, non_blocking)
    if kind:  # frames: this one, on_to / on_cuda / on_copy, the wrapper, then the caller
        count(kind, sys._getframe(3))


def _guarded(torch: Any, original: Callable, check: Callable) -> Callable:
    """``original`` with ``check(*args, **kwargs)`` before it, once per outermost call
    (a subclass's ``__torch_function__`` re-enters the wrapped method), never while
    dynamo traces."""

    def wrapped(*args, **kwargs):
        if _compiling(torch) or getattr(_local, "inside", False):  # dynamo: first, no thread-local
            return original(*args, **kwargs)
        _local.inside = True
        try:
            check(*args, **kwargs)
        except Exception:  # noqa: BLE001  a check never breaks the call it watches
            pass
        finally:
            _local.inside = False
        return original(*args, **kwargs)

    wrapped.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    wrapped.__name__ = getattr(original, "__name__", "wrapped")
    wrapped.__doc__ = getattr(original, "__doc__", None)
    return wrapped


def wrap_copies(torch: Any, count: Callable) -> None:
    """The pageable-copy check on ``Tensor.to/.cuda/.copy_`` and ``torch.tensor/as_tensor``.
    ``count(kind, frame)`` is called from inside the wrapper; ``frame`` is the caller's."""
    if getattr(torch.Tensor.to, "__pk_e2e_wrapped__", False):
        return

    def on_to(self, *args, **kwargs):
        if self.device.type == "cpu":
            dst, dtype, non_blocking = to_target(args, kwargs, torch)
            if dst == "cuda":
                _check_copy(torch, count, self, dtype, non_blocking)

    def on_cuda(self, *args, **kwargs):
        if self.device.type == "cpu":
            non_blocking = kwargs.get("non_blocking", args[1] if len(args) > 1 else False)
            _check_copy(torch, count, self, None, bool(non_blocking))

    def on_copy(self, src, non_blocking=False, *rest, **kwargs):
        if self.device.type == "cuda" and isinstance(src, torch.Tensor) and src.device.type == "cpu":
            _check_copy(torch, count, src, self.dtype, bool(non_blocking), dst_shape=self.shape)

    def on_new(data, *args, **kwargs):
        # torch builds host data into a fresh pageable tensor and copies it, blocking.
        if device_type(kwargs.get("device")) == "cuda" and not (
            isinstance(data, torch.Tensor) and data.device.type == "cuda"
        ):
            count(H2D, sys._getframe(2))

    for name, check in (("to", on_to), ("cuda", on_cuda), ("copy_", on_copy)):
        setattr(torch.Tensor, name, _guarded(torch, getattr(torch.Tensor, name), check))
    for name in ("tensor", "as_tensor"):
        setattr(torch, name, _guarded(torch, getattr(torch, name), on_new))


def arm_sync_debug(torch: Any) -> bool:
    """Set torch's sync debug mode to "warn" in this process, without starting CUDA."""
    setter = getattr(torch._C, "_cuda_set_sync_debug_mode", None)
    if setter is None:  # a CPU build of torch: nothing to arm
        return False
    setter(1)
    return True


def hook_warnings(count: Callable, warnings: Any = None) -> None:
    """Count torch's sync warnings at ``warnings._showwarnmsg`` (not shown), keep an
    "always" filter for them first in the list whatever a library adds later."""
    if warnings is None:
        import warnings
    if getattr(warnings._showwarnmsg, "__pk_e2e_wrapped__", False):
        return
    shown = warnings._showwarnmsg

    def showwarnmsg(msg):
        if is_sync_warning(msg.message):
            count(SYNC, sys._getframe(1))
            return
        shown(msg)

    showwarnmsg.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    warnings._showwarnmsg = showwarnmsg
    add = warnings.filterwarnings

    def ours_first():
        add("always", message=WARNING_TEXT)

    def keep_first(original):
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            ours_first()
            return result

        wrapped.__name__ = original.__name__
        return wrapped

    warnings.filterwarnings = keep_first(add)
    warnings.simplefilter = keep_first(warnings.simplefilter)
    warnings.resetwarnings = keep_first(warnings.resetwarnings)
    ours_first()


def install(torch: Any, count: Callable) -> bool:
    """Both counters in this process; True when torch's sync mode was armed (CUDA build)."""
    hook_warnings(count)
    wrap_copies(torch, count)
    return arm_sync_debug(torch)
