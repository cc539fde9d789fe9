"""gpu_e2e/host_usage.py: the host's steal and an engine's own CPU time around one call, read
from /proc (a fake /proc here; the real one in the last test)."""

from __future__ import annotations

import os

from gpu_e2e import duel_report, host_usage


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
