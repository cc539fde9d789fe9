"""gpu_e2e/host_counters.py: the plan's one-line probe of the host's instructions counter."""

from __future__ import annotations

import errno
import os

from gpu_e2e import cpu_lanes, host_counters


def _paranoid(tmp_path, level: str = "2"):
    path = tmp_path / "perf_event_paranoid"
    path.write_text(f"{level}\n")
    return path


def test_a_vm_without_a_pmu_says_why(tmp_path):
    line = host_counters.probe(lambda: (-1, errno.ENOENT), _paranoid(tmp_path))
    assert line == "instructions counter: not available (No such file or directory; perf_event_paranoid 2)"
    line = host_counters.probe(lambda: (-1, errno.EACCES), _paranoid(tmp_path, "3"))
    assert line == "instructions counter: not available (Permission denied; perf_event_paranoid 3)"


def test_a_counter_that_counts_is_available_and_closed(tmp_path):
    read, write = os.pipe()
    os.write(write, (12345).to_bytes(8, "little"))
    os.close(write)
    line = host_counters.probe(lambda: (read, 0), _paranoid(tmp_path))
    assert line == "instructions counter: available (perf_event_paranoid 2)"
    try:
        os.fstat(read)
        raise AssertionError("the probe left its counter open")
    except OSError:
        pass


def test_a_counter_that_counts_nothing_is_no_counter(tmp_path):
    read, write = os.pipe()
    os.write(write, bytes(8))
    os.close(write)
    assert "opens but counts 0" in host_counters.probe(lambda: (read, 0), _paranoid(tmp_path))


def test_the_real_probe_answers_one_line_on_this_host(tmp_path):
    line = host_counters.probe(paranoid=tmp_path / "absent")
    assert line.startswith("instructions counter: ") and "\n" not in line and "perf_event_paranoid absent" in line


def test_describe_carries_the_probe(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(host_counters, "probe", lambda: "instructions counter: probed")
    root = tmp_path / "sys"
    cpu = root / "devices" / "system" / "cpu" / "cpu0" / "topology"
    cpu.mkdir(parents=True)
    (cpu / "core_id").write_text("0\n")
    (cpu / "physical_package_id").write_text("0\n")
    (cpu / "thread_siblings_list").write_text("0\n")
    assert cpu_lanes.main(["--describe", "--sysfs", str(root)]) == 0
    assert capsys.readouterr().out.strip().endswith("; instructions counter: probed")


def test_a_group_count_sums_its_threads_once_and_closes_them():
    fds = []
    for value in (5, 7):
        read, write = os.pipe()
        os.write(write, value.to_bytes(8, "little"))
        os.close(write)
        fds.append(read)
    count = host_counters.GroupCount.start([1, 2, 3], lambda tid: (fds[tid - 1], 0) if tid < 3 else (-1, errno.ESRCH))
    assert count.fds == fds  # the thread gone meanwhile skipped
    assert count.stop() == 12 and count.stop() == 12 and count.fds == []
    assert host_counters.GroupCount([]).stop() is None
