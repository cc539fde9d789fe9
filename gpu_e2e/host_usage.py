"""What the host did during one timed generate, from the kernel's own accounting (issue 67).

The ninth run (2026-11-28i) timed every duel alone on a one-GPU host and still found an eager
engine's rate moving 1.16-1.59x from round to round, with the same GPU work and the same host
ops in every tree (docs/gpu.md, "Ninth run"). Two readings of /proc, taken around each call,
say where that goes:

* the host's CPU time (``/proc/stat``'s ``cpu`` line): busy, idle and **steal** seconds, the
  time the hypervisor gave this machine's CPUs to someone else. A generate that ran slow while
  steal rose was slowed by the host it ran on, not by its tree. (A guest whose hypervisor
  does not report steal reads 0 there.)
* the engine's own CPU seconds: user + system time of every process in the engine's process
  group (the runner, sglang's scheduler, its detokenizer), from ``/proc/<pid>/stat``. In a
  host-bound eager step this is the host work a token costs, a figure the host's speed moves
  far less than the wall time (stolen time is not counted in it).

Only the engine being timed runs (the duel freezes the others), so the group's CPU time is the
call's. A process that ends between the two readings drops out of the second; its seconds are
lost, not counted twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from . import host_counters

PROC = Path("/proc")
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


def host_cpu(proc: Path = PROC) -> dict[str, int]:
    """The host's CPU time in ticks, summed over its CPUs: ``/proc/stat``'s first line."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            return dict(zip(_FIELDS, values + [0] * (len(_FIELDS) - len(values)), strict=False))
    raise ValueError(f"{proc / 'stat'}: no cpu line")


def group_members(pgid: int, proc: Path = PROC) -> Iterator[tuple[Path, list[str]]]:
    """Each live process whose process group is ``pgid``: its /proc folder and its ``stat``
    fields after the command name (state, ppid, pgrp, ...; utime and stime are 11 and 12)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # the command name sits in parentheses and may hold spaces or parentheses itself
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            yield entry, fields


def group_threads(pgid: int, proc: Path = PROC) -> Iterator[int]:
    """Every thread id of the group's live processes (a process gone since the listing is skipped)."""
    for entry, _ in group_members(pgid, proc):
        try:
            tids = [int(t.name) for t in (entry / "task").iterdir()]
        except OSError:
            continue
        yield from tids


def group_cpu(pgid: int, proc: Path = PROC) -> tuple[int, int]:
    """User + system ticks of every live process whose process group is ``pgid``, and how
    many processes that is (sglang's scheduler must be among them for the figure to mean
    anything: the count says it was)."""
    total = count = 0
    for _, fields in group_members(pgid, proc):
        total += int(fields[11]) + int(fields[12])
        count += 1
    return total, count


def snapshot(pgid: int, proc: Path = PROC) -> dict:
    ticks, count = group_cpu(pgid, proc)
    return {"host": host_cpu(proc), "engine": ticks, "processes": count}


def delta(before: dict, after: dict, ticks_per_s: int | None = None, instructions: int | None = None) -> dict:
    """Seconds between two snapshots: the host's busy, idle and steal time (all CPUs) and the
    engine's own CPU time; with ``instructions`` (host_counters.GroupCount), the instructions
    its threads retired meanwhile."""
    hz = ticks_per_s or _ticks_per_s()
    d = {k: after["host"][k] - before["host"][k] for k in _FIELDS}
    busy = sum(d[k] for k in ("user", "nice", "system", "irq", "softirq"))
    return {
        "host_busy_s": round(busy / hz, 3),
        "host_idle_s": round((d["idle"] + d["iowait"]) / hz, 3),
        "host_steal_s": round(d["steal"] / hz, 3),
        "engine_cpu_s": round((after["engine"] - before["engine"]) / hz, 3),
        "engine_processes": after["processes"],
        **({"engine_instructions": instructions} if instructions is not None else {}),
    }


class Call:
    """What one timed call did on the host: a snapshot now, :meth:`end` the delta (with the
    instructions its engine's threads retired, where the host counts them: host_counters.py);
    :meth:`close` in every case, for the counters' file descriptors."""

    def __init__(
        self, pgid: int, proc: Path = PROC, count: Callable[[list[int]], host_counters.GroupCount] | None = None
    ):
        self.pgid, self.proc = pgid, proc
        start = count or (host_counters.GroupCount.start if host_counters.available() else None)
        self.count = start(list(group_threads(pgid, proc))) if start else host_counters.GroupCount([])
        self.before = snapshot(pgid, proc)

    def end(self, ticks_per_s: int | None = None) -> dict:
        return delta(self.before, snapshot(self.pgid, self.proc), ticks_per_s, self.count.stop())

    def close(self) -> None:
        self.count.stop()
