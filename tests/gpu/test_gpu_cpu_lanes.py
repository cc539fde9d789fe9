"""gpu_e2e/cpu_lanes.py: PIN=1's lanes are whole physical cores (2026-11-28f: lanes of logical
CPUs 0-15 and 16-31 share every core of a 16-core host numbered as below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_e2e import cpu_lanes


def _sysfs(tmp_path, cores: int, threads: int, packages: int = 1, online: str | None = None):
    """Thread t of core c is CPU c + t * cores (a common Linux numbering)."""
    root = tmp_path / "cpu"
    for t in range(threads):
        for c in range(cores):
            topology = root / f"cpu{c + t * cores}" / "topology"
            topology.mkdir(parents=True)
            (topology / "physical_package_id").write_text(f"{c * packages // cores}\n")
            (topology / "core_id").write_text(f"{c}\n")
    (root / "cpufreq").mkdir()  # not a CPU
    (root / "online").write_text(online or f"0-{cores * threads - 1}\n")
    return root


def test_two_lanes_of_a_hyperthreaded_host_share_no_core(tmp_path):
    cores = cpu_lanes.physical_cores(_sysfs(tmp_path, 16, 2))
    assert len(cores) == 16 and cores[0] == [0, 16]
    lanes = [cpu_lanes.lane_cpus(i, 2, cores) for i in (0, 1)]
    assert cpu_lanes.taskset_list(lanes[0]) == "0-7,16-23" and cpu_lanes.taskset_list(lanes[1]) == "8-15,24-31"
    assert not set(lanes[0]) & set(lanes[1])
    assert cpu_lanes.describe(cores) == "16 physical cores, 32 logical CPUs, threads a core [2]"
    for n, cpus in enumerate(("0-7,16-23", "8-15,24-31")):
        (tmp_path / "node" / f"node{n}").mkdir(parents=True)
        (tmp_path / "node" / f"node{n}" / "cpulist").write_text(cpus + "\n")
    numa = cpu_lanes.numa_nodes(tmp_path / "cpu")
    assert cpu_lanes.describe(cores, numa).endswith("; NUMA nodes 0-7,16-23 | 8-15,24-31")


def test_uneven_lanes_offline_cpus_and_too_many_lanes(tmp_path):
    cores = cpu_lanes.physical_cores(_sysfs(tmp_path, 5, 1, online="0-3\n"))  # cpu4 offline
    assert cores == [[0], [1], [2], [3]]
    assert [cpu_lanes.lane_cpus(i, 3, cores) for i in range(3)] == [[0, 1], [2], [3]]
    with pytest.raises(ValueError, match="2 physical core"):
        cpu_lanes.lane_cpus(0, 3, cores[:2])
    with pytest.raises(ValueError, match="not one of"):
        cpu_lanes.lane_cpus(3, 3, cores)


def test_the_command_line_prints_a_taskset_list(tmp_path, capsys):
    root = _sysfs(tmp_path, 4, 2, packages=2)
    assert cpu_lanes.main(["1", "2", "--sysfs", str(root)]) == 0
    assert capsys.readouterr().out.strip() == "2-3,6-7"
    assert cpu_lanes.main(["--describe", "--sysfs", str(root)]) == 0
    assert "4 physical cores" in capsys.readouterr().out


def test_an_engines_threads_are_held_to_the_cpus_asked(tmp_path):
    """The duel's --cpus (2026-11-29): every thread of every process in the engine's group,
    the threads started before the call included, runs on the CPUs asked."""
    import os
    import subprocess
    import sys
    import time

    cpu = min(os.sched_getaffinity(0))
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        task = Path(f"/proc/{proc.pid}/task")
        deadline = time.monotonic() + 20
        while len(list(task.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = cpu_lanes.pin_group(proc.pid, [cpu])
        assert got == {"cpus": str(cpu), "threads": 2}
        assert all(os.sched_getaffinity(int(t.name)) == {cpu} for t in task.iterdir())
    finally:
        proc.kill()
        proc.wait()


def test_cpus_outside_the_host_are_refused_in_one_line():
    import argparse
    import os

    have = sorted(os.sched_getaffinity(0))
    assert cpu_lanes.allowed(cpu_lanes.taskset_list(have)) == have
    for bad in ("x", "", f"{max(have) + 1}"):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            cpu_lanes.allowed(bad)
        assert "\n" not in str(err.value)
