"""Switch the patched tree's seq_lens mirror on and off inside one engine (issue 23).

The cost of the removed sync is a few percent of a step; two engine processes
differ by far more than that for identical work. So the harness measures inside
one process: between generate calls it forces the mirror decision to "kept" (the
patched tree then copies ``seq_lens`` to the host every decode step, like pristine)
or "dropped" (the decision the tree took), in ABBA order.

The switch is the harness's, not the product's: the bundle's ``sitecustomize``
calls :func:`install_listener` in every process when ``PK_E2E_MIRROR_CONTROL``
names a file. The listener thread waits for the file to change, then calls
``set_needs_cpu_seq_lens`` of every loaded copy of patchkit's runtime module (the
one vendored in the tree, ``sglang.srt._patchkit.runtime.seq_lens``, or the
installed ``patchkit.runtime.seq_lens``) and answers in ``<file>.ack-<pid>``.
Only scheduler processes act (those :mod:`.ranks` saw start a Scheduler: the
engine's own process loads the runtime too, and its flag decides nothing). The
runner (:class:`Switch`) writes the file and waits for an answer from every
scheduler (one per TP rank). It only switches between generate calls, when no
batch is in flight.

:func:`abba`, :func:`paired_interval` and :func:`summarise` are pure and
unit-tested on CPU.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from typing import Optional, Sequence

ENV_CONTROL = "PK_E2E_MIRROR_CONTROL"
KEPT, DROPPED = "kept", "dropped"
RUNTIME_SUFFIX = "runtime.seq_lens"


# ------------------------------------------------------------ scheduler process side

def _runtime_modules() -> list:
    return [m for name, m in list(sys.modules.items())
            if name.endswith(RUNTIME_SUFFIX) and hasattr(m, "set_needs_cpu_seq_lens")]


def _is_scheduler() -> bool:
    from . import ranks

    return ranks.process_tp_rank() is not None


def _listen(path: str, period: float, schedulers_only: bool) -> None:
    seen = None
    decided: dict[int, bool] = {}  # module id -> the tree's own decision
    while True:
        time.sleep(period)
        try:
            with open(path) as fh:
                request = fh.read().strip()
        except OSError:
            continue
        # "<arm> <serial>": ABBA asks for the same arm twice in a row, so a request
        # is new when its serial is, not its arm.
        wanted = request.split(" ", 1)[0]
        if request == seen or wanted not in (KEPT, DROPPED):
            continue
        modules = _runtime_modules()
        if not modules or (schedulers_only and not _is_scheduler()):
            continue  # not a scheduler (yet): answer once it is one
        for m in modules:
            own = decided.setdefault(id(m), m.needs_cpu_seq_lens())
            m.set_needs_cpu_seq_lens(True if wanted == KEPT else own)
        state = ",".join(str(m.needs_cpu_seq_lens()) for m in modules)
        with open(f"{path}.ack-{os.getpid()}", "w") as fh:
            fh.write(f"{request} {state} own={','.join(str(v) for v in decided.values())}\n")
        seen = request


def install_listener(path: Optional[str] = None, period: float = 0.005, schedulers_only: bool = True) -> bool:
    path = path or os.environ.get(ENV_CONTROL)
    if not path:
        return False
    threading.Thread(target=_listen, args=(path, period, schedulers_only), daemon=True,
                     name="pk-e2e-mirror-control").start()
    return True


# --------------------------------------------------------------------- runner side

class Switch:
    """Runner's end: ``set(KEPT)`` returns once every scheduler (``schedulers``: the
    TP size) has applied it."""

    def __init__(self, path: str, timeout: float = 30.0, schedulers: int = 1):
        self.path = path
        self.timeout = timeout
        self.schedulers = schedulers
        self.serial = 0

    def _acks(self) -> dict[str, str]:
        folder, base = os.path.split(self.path)
        out = {}
        for name in os.listdir(folder or "."):
            if name.startswith(base + ".ack-"):
                try:
                    with open(os.path.join(folder, name)) as fh:
                        out[name] = fh.read().strip()
                except OSError:
                    pass
        return out

    def set(self, wanted: str) -> list[str]:
        for name in self._acks():
            os.unlink(os.path.join(os.path.dirname(self.path), name))
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            self.serial += 1
            request = f"{wanted} {self.serial}"
            fh.write(request)
        os.replace(tmp, self.path)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            acks = [a for a in self._acks().values() if a.startswith(request + " ")]
            if len(acks) >= self.schedulers:
                return acks
            time.sleep(0.005)
        raise RuntimeError(f"no scheduler process applied mirror={wanted} within {self.timeout} s "
                           f"(is the tree patched, and {ENV_CONTROL} set?)")


# ------------------------------------------------------------------------ pure parts

def abba(pairs: int) -> list[str]:
    """Arm order for ``pairs`` alternations: kept, dropped, dropped, kept, ...: each
    arm goes first as often as second, so a drift over the run hits both alike."""
    order = []
    for i in range(pairs):
        order += [KEPT, DROPPED] if i % 2 == 0 else [DROPPED, KEPT]
    return order


# Two-sided 95 % quantiles of Student's t by degrees of freedom (1-30); beyond, the
# normal 1.96 is within 2 % of it.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
        2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074,
        2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    if df < 1:
        raise ValueError("need at least two samples")
    return _T95[df - 1] if df <= len(_T95) else 1.96


def paired_interval(samples: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % interval of the mean of paired differences."""
    n = len(samples)
    mean = statistics.fmean(samples)
    half = t95(n - 1) * statistics.stdev(samples) / math.sqrt(n)
    return mean, mean - half, mean + half


def summarise(pairs: Sequence[tuple[float, float]], steps: Sequence[int]) -> dict:
    """From ``(kept_s, dropped_s)`` per alternation and the decode steps of each
    generate call: the per-step times, their paired difference and the ratio
    dropped / kept, each with its 95 % interval (the ratio's from the mean of
    per-pair log ratios)."""
    if len(pairs) < 2:
        raise ValueError("need at least two alternations")
    per_step = [(k / s, d / s) for (k, d), s in zip(pairs, steps)]
    diff = paired_interval([(k - d) * 1000.0 for k, d in per_step])
    logr = paired_interval([math.log(d / k) for k, d in per_step])
    return {
        "pairs": len(pairs),
        "steps": statistics.median(steps),
        "kept_ms_per_step": statistics.fmean(k for k, _ in per_step) * 1000.0,
        "dropped_ms_per_step": statistics.fmean(d for _, d in per_step) * 1000.0,
        "saved_ms_per_step": diff,
        "ratio": tuple(math.exp(x) for x in logr),
    }


def summary_of_calls(calls: Sequence[dict]) -> dict:
    """:func:`summarise` over the runner's recorded calls (consecutive calls form a
    pair, as :func:`abba` orders them), plus the checks that make the comparison
    fair: each arm's ``prepare_for_decode`` syncs per step (kept ~1, dropped 0),
    identical outputs in every call, the same number of steps in both arms."""
    pairs, steps = [], []
    for a, b in zip(calls[0::2], calls[1::2]):
        kept, dropped = (a, b) if a["arm"] == KEPT else (b, a)
        if {kept["arm"], dropped["arm"]} != {KEPT, DROPPED}:
            raise ValueError("calls are not in kept/dropped pairs")
        pairs.append((kept["elapsed_s"], dropped["elapsed_s"]))
        steps.append(max(kept["decode_steps"], 1))
    out = summarise(pairs, steps)

    def per_step(arm: str) -> Optional[float]:
        mine = [c for c in calls if c["arm"] == arm]
        total = sum(c["decode_steps"] for c in mine)
        return sum(c["prepare_syncs"] for c in mine) / total if total else None

    out["prepare_syncs_per_step"] = {KEPT: per_step(KEPT), DROPPED: per_step(DROPPED)}
    out["same_steps"] = len({c["decode_steps"] for c in calls}) == 1
    out["identical_outputs"] = all(c["same_output"] for c in calls)
    accepts = [c["accept_length"] for c in calls if c.get("accept_length")]
    out["accept_length"] = statistics.fmean(accepts) if accepts else None
    return out
