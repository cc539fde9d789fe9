"""Whether this host lets a process count the CPU instructions its threads retire
(``perf_event_open``, the kernel's hardware counters; probed once on the plan's host).

Why: the eager cells are host-bound and each engine's one busy thread moves ~2x in speed from
call to call on the GPU hosts (docs/gpu.md, the tenth and eleventh runs), so wall time cannot
show a 2% difference in the trees' host work. Instructions retired do not depend on how fast the
core ran; where the host exposes them, a per-step count per tree is the measure to take. A VM
without a virtual PMU answers ENOENT (this CI machine does); ``perf_event_paranoid`` 3 refuses.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Callable
from functools import cache
from pathlib import Path

#: perf_event_open's syscall number by machine (asm/unistd.h)
SYSCALL = {"x86_64": 298, "aarch64": 241}
PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS = 0, 1
ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7 and below fit; the kernel reads what it knows
EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 5, 1 << 6  # user space only: allowed at paranoid 2
PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")


def _attr() -> ctypes.Array:
    raw = bytearray(ATTR_SIZE)
    struct.pack_into("IIQ", raw, 0, PERF_TYPE_HARDWARE, ATTR_SIZE, PERF_COUNT_HW_INSTRUCTIONS)
    struct.pack_into("Q", raw, 40, EXCLUDE_KERNEL | EXCLUDE_HV)  # the flags word after sample_type
    return ctypes.create_string_buffer(bytes(raw), ATTR_SIZE)


def _open_counter(tid: int = 0) -> tuple[int, int]:
    """(fd or -1, errno): an instructions counter on thread ``tid`` (0: this one), any CPU. It
    counts from now; another process's thread needs ptrace's permission (py-spy's own)."""
    number = SYSCALL.get(platform.machine())
    if number is None:
        return -1, 0
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(number, _attr(), tid, -1, -1, 0)
    return fd, ctypes.get_errno() if fd < 0 else 0


def probe(open_counter: Callable[[], tuple[int, int]] = _open_counter, paranoid: Path = PARANOID) -> str:
    """One line for the plan's log: whether an instructions counter opens, and if not why."""
    level = paranoid.read_text().strip() if paranoid.is_file() else "absent"
    fd, err = open_counter()
    if fd >= 0:
        # a counter that opens but counts nothing (some hypervisors) is no counter: some work, then read
        sum(range(20000))
        count = struct.unpack("Q", os.read(fd, 8))[0]
        os.close(fd)
        if count > 0:
            return f"instructions counter: available (perf_event_paranoid {level})"
        return f"instructions counter: opens but counts 0 (perf_event_paranoid {level})"
    why = os.strerror(err) if err else f"no perf_event_open number for {platform.machine()}"
    return f"instructions counter: not available ({why}; perf_event_paranoid {level})"


@cache
def available() -> bool:
    """The probe's answer, asked once a process."""
    return probe().startswith("instructions counter: available")


class GroupCount:
    """Instructions retired in user space by a set of threads from :meth:`start` to :meth:`stop`:
    a duel's engine over one call (host_usage.Call). A thread that starts meanwhile is not
    counted; an engine's threads are all up once it has warmed up."""

    def __init__(self, fds: list[int]):
        self.fds = fds
        self.total: int | None = None

    @classmethod
    def start(cls, tids: list[int], open_counter: Callable[[int], tuple[int, int]] = _open_counter) -> GroupCount:
        """A counter on each thread that lets one open (a thread gone meanwhile is skipped)."""
        return cls([fd for fd, _ in map(open_counter, tids) if fd >= 0])

    def stop(self) -> int | None:
        """The count summed over the threads (None without counters); the counters closed. A
        second call gives the same figure."""
        if self.total is None and self.fds:
            self.total = sum(struct.unpack("Q", os.read(fd, 8))[0] for fd in self.fds)
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        return self.total
