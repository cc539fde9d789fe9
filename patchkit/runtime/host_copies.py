"""Host-to-device copies that do not make the host wait (issue 53).

A copy from pageable host memory blocks the host: without ``non_blocking``
until the stream has run everything queued before it, and with it the driver
still stages the pageable bytes synchronously. Upstream made the per-step
copies of spec-v2 ``prepare_for_decode`` (0.5.13) and the penalizers'
output ids (sglang #28491, #28500, 0.5.14) ``non_blocking``, the latter from
pinned memory; patched code pins both. A fresh pinned tensor per step is
safe: torch's caching host allocator reuses a pinned block only once the
copies that read it have run.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the functions that need it.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["pin_memory_for", "pinned_tensor"]


def pin_memory_for(device: Any) -> bool:
    """Whether a host tensor bound for ``device`` is pinned: on a CUDA device
    (ROCm's included) with a driver there; never for the CPU, and not on
    other accelerators, whose copies stay as they were (pageable)."""
    import torch

    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def pinned_tensor(data: Any, *, pin_for: Any, **kwargs: Any) -> Any:
    """``torch.tensor(data, **kwargs)``, pinned where ``pin_memory_for(pin_for)``
    (``ForwardBatch.init_new``'s per-step lists, as 0.5.19 builds them). A
    tensor is kept as ``torch.as_tensor`` keeps it: needs-cpu-seq-lens's
    GPU-only draft extend hands its lengths over on the device."""
    import torch

    if isinstance(data, torch.Tensor):
        return torch.as_tensor(data, **kwargs)
    return torch.tensor(data, pin_memory=pin_memory_for(pin_for), **kwargs)
