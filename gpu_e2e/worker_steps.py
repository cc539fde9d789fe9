"""Every step a rank's spec-v2 worker runs, busy or idle (issue 58: DP attention).

The per-step denominator of the TP tables is the number of ``prepare_for_decode``
calls (:data:`syncs.CALL_PROBES`). Under DP attention a rank with no request of its
own still runs every step of the group, on an idle batch
(``SchedulerDPAttnMixin.get_idle_batch``), and never calls ``prepare_for_decode`` (it
has no running batch). What every rank does call, busy or idle, is
``EAGLEWorkerV2.forward_batch_generation`` (``Scheduler.run_batch`` under the overlap
schedule, 0.5.10 … 0.5.12.post1), so that is probed here, and each call is counted
by the forward mode of the batch it was given:

* ``idle``: ``forward_mode.is_idle()`` (this rank has nothing; a peer has);
* ``extend``: ``forward_mode.is_extend()`` (a prefill of this rank's own requests);
* ``decode``: anything else (a decode / verify step of this rank's own requests).

Reading the mode is a Python attribute and an enum compare: no tensor is read, so
the probe adds no sync. Installed with the sync counter (:func:`syncs.install`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import syncs

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
WORKER_CLASS, WORKER_METHOD = "EAGLEWorkerV2", "forward_batch_generation"
KEY = f"call|{WORKER_MODULE}:{WORKER_CLASS}.{WORKER_METHOD}@"
KINDS = ("decode", "extend", "idle")


def kind_of(batch: Any) -> str:
    """``idle``, ``extend`` or ``decode`` from the batch's ``forward_mode``."""
    mode = getattr(batch, "forward_mode", None)
    if mode is not None and mode.is_idle():
        return "idle"
    if mode is not None and mode.is_extend():
        return "extend"
    return "decode"


def install() -> None:
    syncs.on_import(WORKER_MODULE, _probe_worker)


def _probe_worker(module: Any) -> None:
    cls = getattr(module, WORKER_CLASS, None)
    original = getattr(cls, WORKER_METHOD, None)
    if original is None or getattr(original, "__pk_e2e_wrapped__", False):
        return

    def forward_batch_generation(self, *args, **kwargs):
        try:  # the batch: first argument (model_worker_batch up to 0.5.12.post1, batch in 0.5.13)
            syncs.bump(KEY + kind_of(args[0] if args else next(iter(kwargs.values()), None)))
        except Exception:  # noqa: BLE001  never disturb the step being counted
            pass
        return original(self, *args, **kwargs)

    forward_batch_generation.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    forward_batch_generation.__name__ = original.__name__
    forward_batch_generation.__qualname__ = original.__qualname__
    forward_batch_generation.__doc__ = original.__doc__
    setattr(cls, WORKER_METHOD, forward_batch_generation)


def steps_of(table: Mapping[str, int]) -> dict[str, int]:
    """``{"decode": n, "extend": n, "idle": n}`` counted in a sync table (or its delta)."""
    return {k: int(table.get(KEY + k, 0)) for k in KINDS}


def total(steps: Mapping[str, int]) -> int:
    """Every worker step of a rank: the denominator of its waits per step."""
    return sum(int(steps.get(k, 0)) for k in KINDS)


def busy(steps: Mapping[str, int]) -> int:
    return int(steps.get("decode", 0)) + int(steps.get("extend", 0))
