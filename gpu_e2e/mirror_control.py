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

:func:`abba`, :func:`paired_interval`, :func:`median_interval` and :func:`summarise` are pure and
unit-tested on CPU.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Optional

ENV_CONTROL = "PK_E2E_MIRROR_CONTROL"
KEPT, DROPPED = "kept", "dropped"
RUNTIME_SUFFIX = "runtime.seq_lens"


# ------------------------------------------------------------ scheduler process side


def _runtime_modules() -> list:
    return [
        m
        for name, m in list(sys.modules.items())
        if name.endswith(RUNTIME_SUFFIX) and hasattr(m, "set_needs_cpu_seq_lens")
    ]


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
    threading.Thread(
        target=_listen, args=(path, period, schedulers_only), daemon=True, name="pk-e2e-mirror-control"
    ).start()
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
        raise RuntimeError(
            f"no scheduler process applied mirror={wanted} within {self.timeout} s "
            f"(is the tree patched, and {ENV_CONTROL} set?)"
        )


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
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


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


def median_interval(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, low, high): the distribution-free 95 % interval of the median (sign
    test: order statistics ``k`` and ``n - k + 1``). A call the host stalled in
    (tens of percent slower, either arm) moves it far less than the mean."""
    xs = sorted(samples)
    n = len(xs)
    if n < 6:
        raise ValueError("need at least six samples for a 95 % interval of the median")
    # the largest k with P(Binomial(n, 1/2) <= k - 1) <= 0.025
    k, tail = 0, 0.0
    while True:
        nxt = tail + math.comb(n, k) / 2**n
        if nxt > 0.025:
            break
        tail, k = nxt, k + 1
    return statistics.median(xs), xs[k - 1], xs[n - k]  # k >= 1 once n >= 6


def summarise(pairs: Sequence[tuple[float, float]], steps: float) -> dict:
    """From ``(kept_s, dropped_s)`` per alternation and the decode steps of one
    generate call (the same in every call: the work is identical): the per-step
    times, their paired difference and the ratio dropped / kept, each with its
    95 % interval (Student's t over the pairs; the ratio's from the mean of the
    per-pair log ratios), and the median ratio with its distribution-free interval."""
    if len(pairs) < 2:
        raise ValueError("need at least two alternations")
    ratios = [d / k for k, d in pairs]
    diff = paired_interval([(k - d) * 1000.0 / steps for k, d in pairs])
    logr = paired_interval([math.log(r) for r in ratios])
    return {
        "pairs": len(pairs),
        "steps": steps,
        "kept_ms_per_step": statistics.fmean(k for k, _ in pairs) * 1000.0 / steps,
        "dropped_ms_per_step": statistics.fmean(d for _, d in pairs) * 1000.0 / steps,
        "saved_ms_per_step": diff,
        "ratio": tuple(math.exp(x) for x in logr),
        "median_ratio": median_interval(ratios) if len(ratios) >= 6 else None,
    }


def summary_of_calls(calls: Sequence[dict]) -> dict:
    """:func:`summarise` over the runner's recorded calls (consecutive calls form a
    pair, as :func:`abba` orders them), plus the checks that make the comparison
    fair: each arm's ``prepare_for_decode`` syncs per step (kept ~1, dropped 0) and
    identical outputs in every call.

    The steps of one call are the mean over all calls: every call does the same
    work, and a sync counter's last flush can land after the runner's snapshot,
    moving a few steps from one call to the next (2026-11-24's first round); the
    total is exact."""
    pairs = []
    for a, b in zip(calls[0::2], calls[1::2]):
        kept, dropped = (a, b) if a["arm"] == KEPT else (b, a)
        if {kept["arm"], dropped["arm"]} != {KEPT, DROPPED}:
            raise ValueError("calls are not in kept/dropped pairs")
        pairs.append((kept["elapsed_s"], dropped["elapsed_s"]))
    steps = max(sum(c["decode_steps"] for c in calls) / len(calls), 1.0)
    out = summarise(pairs, steps)

    def per_step(arm: str) -> Optional[float]:
        mine = [c for c in calls if c["arm"] == arm]
        total = sum(c["decode_steps"] for c in mine)
        return sum(c["prepare_syncs"] for c in mine) / total if total else None

    out["prepare_syncs_per_step"] = {KEPT: per_step(KEPT), DROPPED: per_step(DROPPED)}
    out["identical_outputs"] = all(c["same_output"] for c in calls)
    accepts = [c["accept_length"] for c in calls if c.get("accept_length")]
    out["accept_length"] = statistics.fmean(accepts) if accepts else None
    return out
