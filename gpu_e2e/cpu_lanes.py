"""Each plan lane's share of the host's CPUs, as whole physical cores (issue 67, 2026-11-28f).

plan.sh's ``PIN=1`` used to give lane ``i`` of ``n`` the logical CPUs ``[i*k, (i+1)*k)``. On a
host whose hyperthreads are numbered ``c`` and ``c + cores`` (a common Linux numbering; the
runs did not record the H200 hosts' own), lane 0 and lane 1 then share every physical core.
The 2026-11-28f profiles showed what a busy neighbour lane costs: an eager, launch-bound
engine ran 1.55x slower a step while the other lane started engines, with the same GPU work.
The plan's log now records the host's cores (``--describe``) and each lane's CPUs. This module groups the logical CPUs by
(package, core) from sysfs and hands each lane whole cores, both hyperthreads included:

    python3 -m pk_gpu_e2e.cpu_lanes LANE LANES        # prints a taskset list: "0-7,16-23"
    python3 -m pk_gpu_e2e.cpu_lanes --describe        # the host's cores, for the plan's log

Standard library only (it runs on the device machine before any engine). ``pin_group`` holds
a running engine's threads to given CPUs (the duel's ``--cpus``).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from . import host_counters, host_usage

SYSFS = Path("/sys/devices/system/cpu")


def cpu_list(text: str) -> list[int]:
    """A CPU list as sysfs and taskset write it ("0-3,8,10-11") as numbers."""
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores(sysfs: Path = SYSFS) -> list[list[int]]:
    """The online logical CPUs grouped by physical core, ordered by (package, core id)."""
    online = cpu_list((sysfs / "online").read_text()) if (sysfs / "online").exists() else None
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu_dir in sysfs.iterdir():
        match = re.fullmatch(r"cpu(\d+)", cpu_dir.name)
        if not match or (online is not None and int(match[1]) not in online):
            continue
        topology = cpu_dir / "topology"
        try:
            key = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):  # no topology: the CPU is its own core
            key = (-1, int(match[1]))
        cores.setdefault(key, []).append(int(match[1]))
    return [sorted(cpus) for _, cpus in sorted(cores.items())]


def lane_cpus(lane: int, lanes: int, cores: list[list[int]]) -> list[int]:
    """Lane ``lane`` of ``lanes``: an equal run of whole cores (the first lanes take one more
    core where they do not divide evenly). Raises on a lane out of range or fewer cores than lanes."""
    if not 0 <= lane < lanes:
        raise ValueError(f"lane {lane} is not one of {lanes}")
    if len(cores) < lanes:
        raise ValueError(f"{len(cores)} physical core(s) for {lanes} lanes")
    share, extra = divmod(len(cores), lanes)
    start = lane * share + min(lane, extra)
    mine = cores[start : start + share + (1 if lane < extra else 0)]
    return sorted(cpu for core in mine for cpu in core)


def taskset_list(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs)


def allowed(text: str) -> list[int]:
    """``--cpus``'s value: a CPU list this process may run on, or a one-line refusal."""
    try:
        cpus = cpu_list(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a CPU list (e.g. 2-3 or 2,10)") from None
    outside = sorted(set(cpus) - os.sched_getaffinity(0))
    if not cpus or outside:
        have = taskset_list(sorted(os.sched_getaffinity(0)))
        raise argparse.ArgumentTypeError(f"{text!r}: CPU(s) {outside or 'none'} not among this host's {have}")
    return sorted(set(cpus))


def pin_group(pgid: int, cpus: list[int], proc: Path = host_usage.PROC) -> dict:
    """Every thread of every live process in process group ``pgid`` (an engine: its runner,
    sglang's scheduler and detokenizer) held to ``cpus`` (``sched_setaffinity``, thread by
    thread: a process's affinity call moves only the thread named). The duel's ``--cpus``
    (2026-11-29): the tenth run's FA3 8B engines each ran one busy thread whose speed moved
    1.9-2.1x between calls, and the trees' calls were barely correlated round by round, so
    each engine's thread may have sat on cores of its own speed for the whole duel. Held to
    the same CPUs, the trees' calls (one at a time) share whatever those cores' speed is.
    Returns the list as taskset writes it and the threads held (a thread gone meanwhile is
    skipped; new ones inherit their creator's affinity)."""
    threads = 0
    for tid in host_usage.group_threads(pgid, proc):
        try:
            os.sched_setaffinity(tid, cpus)
            threads += 1
        except ProcessLookupError:
            pass
    return {"cpus": taskset_list(cpus), "threads": threads}


def numa_nodes(sysfs: Path = SYSFS) -> list[str]:
    """Each NUMA node's CPU list as sysfs writes it (``node/nodeN/cpulist``), in node order."""
    nodes = sysfs.parent / "node"
    found = sorted(
        (int(d.name[4:]), (d / "cpulist").read_text().strip())
        for d in (nodes.iterdir() if nodes.is_dir() else [])
        if re.fullmatch(r"node\d+", d.name) and (d / "cpulist").exists()
    )
    return [cpus for _, cpus in found]


def describe(cores: list[list[int]], numa: list[str] | None = None) -> str:
    """The host's cores for the plan's log; with ``numa``, its NUMA nodes' CPUs too (an engine
    whose memory sits on the node away from the GPU is slower at every step: 2026-11-29)."""
    threads = sorted({len(c) for c in cores})
    text = f"{len(cores)} physical cores, {sum(map(len, cores))} logical CPUs, threads a core {threads}"
    return text + (f"; NUMA nodes {' | '.join(numa)}" if numa else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lane", nargs="?", type=int)
    ap.add_argument("lanes", nargs="?", type=int)
    ap.add_argument("--describe", action="store_true", help="print the host's cores and exit")
    ap.add_argument("--sysfs", type=Path, default=SYSFS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cores = physical_cores(args.sysfs)
    if args.describe:
        print(f"{describe(cores, numa_nodes(args.sysfs))}; {host_counters.probe()}")
        return 0
    if args.lane is None or args.lanes is None:
        ap.error("LANE and LANES are needed (or --describe)")
    print(taskset_list(lane_cpus(args.lane, args.lanes, cores)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
