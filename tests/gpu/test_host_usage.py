"""gpu_e2e/host_usage.py: the host's steal and an engine's own CPU time around one call, read
from /proc (a fake /proc here; the real one in the last test)."""

from __future__ import annotations

import os

from gpu_e2e import duel_report, host_counters, host_usage


def _proc(tmp_path, stat: str, procs: dict[int, tuple[str, int, int, int]]):
    (tmp_path / "stat").write_text(f"{stat}\ncpu0 1 2 3 4 5 6 7 8\nintr 9\n")
    for pid, (comm, pgrp, utime, stime) in procs.items():
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        rest = ["S", "1", str(pgrp)] + ["0"] * 8 + [str(utime), str(stime)] + ["0"] * 30
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (tmp_path / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return tmp_path


def test_a_snapshot_sums_the_engines_process_group_only(tmp_path):
    # a command name with spaces and parentheses, as sglang's "sglang::scheduler" titles can be
    proc = _proc(
        tmp_path,
        "cpu  100 0 50 1000 10 1 2 30 0 0",
        {10: ("python3", 10, 5, 1), 11: ("sglang::sched (x) y", 10, 40, 9), 12: ("other", 99, 1000, 1000)},
    )
    snap = host_usage.snapshot(10, proc)
    assert (snap["engine"], snap["processes"]) == (55, 2)
    assert snap["host"] == dict(user=100, nice=0, system=50, idle=1000, iowait=10, irq=1, softirq=2, steal=30)


def test_the_delta_is_seconds_of_busy_idle_steal_and_the_engine(tmp_path):
    before = host_usage.snapshot(10, _proc(tmp_path, "cpu  100 0 50 1000 10 1 2 30", {10: ("a", 10, 5, 1)}))
    after = host_usage.snapshot(10, _proc(tmp_path, "cpu  300 0 90 1400 10 1 2 80", {10: ("a", 10, 105, 21)}))
    assert host_usage.delta(before, after, ticks_per_s=100) == {
        "host_busy_s": 2.4,
        "host_idle_s": 4.0,
        "host_steal_s": 0.5,
        "engine_cpu_s": 1.2,
        "engine_processes": 1,
    }


def test_the_report_gives_cpu_a_token_and_the_steal_share_each_round():
    def call(r, engine, elapsed, cpu, steal):
        host = {"host_busy_s": 8.0, "host_idle_s": 2.0 - steal, "host_steal_s": steal, "engine_cpu_s": cpu}
        host["engine_processes"] = 3
        return {
            "round": r,
            "batch_size": 64,
            "engine": engine,
            "elapsed_s": elapsed,
            "completion_tokens": 1000,
            "host": host,
        }

    calls = [call(1, "pristine", 2.0, 1.5, 0.0), call(2, "pristine", 4.0, 1.6, 1.0), call(1, "patched", 2.0, 1.4, 0.5)]
    rows = duel_report.host(calls)
    assert rows == [
        {
            "engine": "patched",
            "batch_size": 64,
            "processes": 3,
            "cpu_ms_per_token": [1.4],
            "steal": [0.05],
            "tok_per_s": [500.0],
        },
        {
            "engine": "pristine",
            "batch_size": 64,
            "processes": 3,
            "cpu_ms_per_token": [1.5, 1.6],
            "steal": [0.0, 0.1],
            "tok_per_s": [500.0, 250.0],
        },
    ]
    md = duel_report.markdown({"calls": calls, "summary": []})
    assert "| pristine | 64 | 3 | 1.500, 1.600 | 0.0%, 10.0% | 500, 250 |" in md


def test_this_process_reads_its_own_group():
    snap = host_usage.snapshot(os.getpgrp())
    assert snap["engine"] >= 0 and snap["processes"] >= 1 and snap["host"]["idle"] > 0


def _tasks(proc, pid: int, tids: list[int]) -> None:
    for tid in tids:
        (proc / str(pid) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)


def test_the_groups_threads_are_every_task_of_its_processes(tmp_path):
    proc = _proc(tmp_path, "cpu  1 0 1 1 0 0 0 0", {10: ("a", 10, 0, 0), 11: ("b", 10, 0, 0), 12: ("c", 99, 0, 0)})
    _tasks(proc, 10, [10, 13])
    _tasks(proc, 11, [11])
    _tasks(proc, 12, [12])
    assert sorted(host_usage.group_threads(10, proc)) == [10, 11, 13]


def test_a_call_adds_the_instructions_its_engines_threads_retired(tmp_path):
    proc = _proc(tmp_path, "cpu  100 0 50 1000 10 1 2 30", {10: ("a", 10, 5, 1)})
    _tasks(proc, 10, [10, 14])
    pipes = {}

    def open_counter(tid: int) -> tuple[int, int]:
        read, write = os.pipe()
        os.write(write, (1_000_000 * tid).to_bytes(8, "little"))
        os.close(write)
        pipes[tid] = read
        return read, 0

    started = []

    def count(tids):
        started.append(sorted(tids))
        return host_counters.GroupCount.start(tids, open_counter)

    call = host_usage.Call(10, proc, count=count)
    _proc(tmp_path, "cpu  300 0 90 1400 10 1 2 80", {10: ("a", 10, 105, 21)})
    got = call.end(ticks_per_s=100)
    call.close()  # a second stop: the same figure, nothing closed twice
    assert started == [[10, 14]]
    assert (got["engine_cpu_s"], got["engine_instructions"]) == (1.2, 24_000_000)
    for fd in pipes.values():
        try:
            os.fstat(fd)
            raise AssertionError("a counter left open")
        except OSError:
            pass


def test_without_counters_a_call_is_the_proc_reading_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(host_counters, "available", lambda: False)
    proc = _proc(tmp_path, "cpu  100 0 50 1000 10 1 2 30", {10: ("a", 10, 5, 1)})
    call = host_usage.Call(10, proc)
    got = call.end(ticks_per_s=100)
    call.close()
    assert "engine_instructions" not in got and got["engine_processes"] == 1


def test_the_report_gives_instructions_a_token_where_counted():
    def call(r, engine, instructions):
        host = {"host_busy_s": 1.0, "host_idle_s": 1.0, "host_steal_s": 0.0, "engine_cpu_s": 1.0}
        if instructions is not None:
            host["engine_instructions"] = instructions
        return {
            "round": r,
            "batch_size": 8,
            "engine": engine,
            "elapsed_s": 1.0,
            "completion_tokens": 1000,
            "host": host,
        }

    calls = [call(1, "pristine", 2_000_000_000), call(2, "pristine", 3_000_000_000), call(1, "patched", 1_500_000_000)]
    assert duel_report.instructions(calls) == [
        {"engine": "patched", "batch_size": 8, "median": 1.5, "rounds": [1.5]},
        {"engine": "pristine", "batch_size": 8, "median": 2.5, "rounds": [2.0, 3.0]},
    ]
    md = duel_report.markdown({"calls": calls, "summary": []})
    assert "| pristine | 8 | 2.5000 | 2.0000, 3.0000 |" in md
    assert "instructions retired" not in duel_report.markdown({"calls": [call(1, "patched", None)], "summary": []})
