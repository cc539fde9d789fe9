"""Ordering the schedule stream after the forward stream without a host wait (issue 57).

Under the overlap scheduler, spec v2 orders the next batch's preparation after
the previous forward's verify with an event the forward records
(``verify_done``). 0.5.4 .. 0.5.12.post1 waited for it on the host
(``Event.synchronize``): the host could not prepare step N+1 while step N's
verify ran. Upstream 0.5.13 (sglang #25879, kept through 0.5.23) waits for its
publish event on the stream instead (``Event.wait``): the GPU keeps the order,
and the host goes on. ROCm keeps the host wait, as upstream does ("Event.wait()
regresses TPOT on AMD MI355"), and so does any device that is not CUDA.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the function.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["wait_event_on_stream"]


def wait_event_on_stream(event: Any) -> None:
    """Make the current stream wait for ``event``: ``event.wait()`` for a
    CUDA event on CUDA, so the host does not block; ``event.synchronize()``
    (a host wait, what the release did) on ROCm and for any other event. Any
    host read of what the event guards still sees it: a copy to the host is
    queued on the current stream, after this wait."""
    import torch

    if isinstance(event, torch.cuda.Event) and torch.version.hip is None:
        event.wait()
    else:
        event.synchronize()
