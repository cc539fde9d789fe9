"""gpu_e2e/py_stacks.py: a duel's timed calls sampled with py-spy (issue 67, after the tenth run),
read back as each function's time a decode step, engine against engine. A stand-in py-spy
writes what the real one writes (its raw format, on SIGINT), so no test needs ptrace."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from fake_engine_bundle import fake_bundle

from gpu_e2e import duel, py_stacks

# py-spy's raw output with --subprocesses: the process chain first, then the Python frames
RAW = """\
process 10:"python3 -m pk_gpu_e2e.runner --serve";process 11:"sglang::scheduler";event_loop (scheduler.py:900);run_batch (scheduler.py:1200);forward (worker.py:50) 60
process 10:"python3 -m pk_gpu_e2e.runner --serve";process 11:"sglang::scheduler";event_loop (scheduler.py:900);run_batch (scheduler.py:1201);bound (host_bound.py:70) 20
process 10:"python3 -m pk_gpu_e2e.runner --serve";process 11:"sglang::scheduler";event_loop (scheduler.py:905);process_batch_result (scheduler.py:1300) 20
process 10:"python3 -m pk_gpu_e2e.runner --serve";process 12:"sglang::detokenizer";event_loop (detokenizer.py:10) 7
process 10:"python3 -m pk_gpu_e2e.runner --serve";wait (runner.py:5) 3
"""

FAKE_PY_SPY = """\
import json, signal, sys, time
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("-o") + 1])
Path(str(out) + ".argv").write_text(json.dumps(args))
def done(*_):
    out.write_text(Path(__file__).with_name("raw.txt").read_text())
    sys.exit(0)
signal.signal(signal.SIGINT, done)
while True:
    time.sleep(0.01)
"""


def _fake_py_spy(tmp_path: Path, raw: str = RAW) -> str:
    script = tmp_path / "py-spy"
    script.write_text(f"#!{sys.executable}\n{FAKE_PY_SPY}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "raw.txt").write_text(raw)
    return str(script)


def test_samples_are_read_by_process_and_stack():
    got = py_stacks.parse(RAW)
    assert set(got) == {"scheduler", "detokenizer", "python3"}
    assert sum(got["scheduler"].values()) == 100 and sum(got["detokenizer"].values()) == 7
    assert got["python3"][("wait (runner.py:5)",)] == 3
    assert py_stacks.process_kind("sglang::scheduler_TP1_DP0") == "scheduler"


def test_a_functions_time_a_step_is_its_share_of_the_samples():
    """100 scheduler samples over a call of 40 ms a step: run_batch holds 80 of them (two lines,
    one function), so 32 ms inclusive; the host bound 20 samples of its own, 8 ms."""
    step = py_stacks.per_step(py_stacks.parse(RAW)["scheduler"], 40.0)
    assert step["inclusive"]["run_batch (scheduler.py)"] == pytest.approx(32.0)
    assert step["inclusive"]["event_loop (scheduler.py)"] == pytest.approx(40.0)
    assert step["self"]["bound (host_bound.py)"] == pytest.approx(8.0)
    assert "run_batch (scheduler.py)" not in step["self"]


def _run_folder(tmp_path: Path) -> Path:
    """A duel with two engines, two rounds at bs 4: 8 decode steps a call (verify_ct 32), the
    patched calls twice as long; the patched scheduler spends twice the share in the bound."""
    run = tmp_path / "run"
    (run / "stacks").mkdir(parents=True)
    calls = []
    for r in (1, 2):
        for engine, elapsed in (("pristine", 0.8), ("patched", 1.6)):
            calls.append({"round": r, "batch_size": 4, "engine": engine, "elapsed_s": elapsed, "verify_ct": 32})
            raw = RAW if engine == "pristine" else RAW.replace(") 20\n", ") 40\n", 1)
            (run / "stacks" / py_stacks.sample_name(engine, 4, r)).write_text(raw)
    (run / "duel.json").write_text(json.dumps({"calls": calls}))
    return run


def test_the_report_puts_two_engines_side_by_side_per_decode_step(tmp_path):
    run = _run_folder(tmp_path)
    base = py_stacks.engine_profile(run, "pristine", 4)
    other = py_stacks.engine_profile(run, "patched", 4)
    assert base["calls"] == other["calls"] == 2
    # pristine: 100 ms a step (0.8 s over 8 steps); the bound 20 of 100 samples
    assert base["inclusive"]["bound (host_bound.py)"] == pytest.approx(20.0)
    # patched: 200 ms a step; the bound 40 of 120 samples
    assert other["inclusive"]["bound (host_bound.py)"] == pytest.approx(200 * 40 / 120)
    top = py_stacks.compare(base, other)[0]
    assert top["function"] == "event_loop (scheduler.py)" and top["diff_ms"] == pytest.approx(100.0)
    md = py_stacks.markdown("pristine", "patched", base, other)
    assert "| `bound (host_bound.py)` | 20.00 | 66.67 | +46.67 |" in md
    assert py_stacks.main([str(run), "--batch-size", "4"]) == 0


def test_a_sampler_runs_py_spy_over_the_engines_process_tree_until_stopped(tmp_path):
    spy = _fake_py_spy(tmp_path)
    out = tmp_path / "stacks" / "patched-bs4-r1.txt"
    sampler = py_stacks.Sampler(spy, os.getpid(), out, rate=50)
    argv_file = Path(str(out) + ".argv")
    for _ in range(500):
        if argv_file.exists():
            break
        time.sleep(0.01)
    assert sampler.stop() == out and out.read_text() == RAW
    args = json.loads(argv_file.read_text())
    assert args[:3] == ["record", "--pid", str(os.getpid())]
    assert {"--subprocesses", "--nonblocking"} <= set(args)
    assert args[args.index("--rate") + 1] == "50" and args[args.index("--format") + 1] == "raw"


def test_a_sampler_that_wrote_nothing_says_so(tmp_path):
    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\necho 'Permission denied' >&2\nexit 1\n")
    spy.chmod(spy.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "stacks" / "x.txt"
    sampler = py_stacks.Sampler(str(spy), os.getpid(), out)
    sampler.proc.wait(timeout=30)
    assert sampler.stop() is None
    assert "Permission denied" in out.with_suffix(".log").read_text()


def test_the_duel_samples_the_first_rounds_timed_calls_only(tmp_path, monkeypatch):
    """--py-spy with --py-spy-rounds 1: round 1's timed calls sampled, round 2's and the warm-ups not."""
    pytest.importorskip("torch")  # the fake bundle's sitecustomize counts syncs in the runner
    monkeypatch.setenv("PK_FAKE_CALL_S", "0.2")
    spy = _fake_py_spy(tmp_path)
    b = fake_bundle(tmp_path)
    out = tmp_path / "out"
    rc = duel.main(
        [
            *("--out", str(out), "--work", str(tmp_path / "work")),
            *("--engine", f"pristine={b}:9.9:pristine", "--engine", f"patched={b}:9.9:patched"),
            *("--batch-sizes", "4", "--rounds", "2", "--max-new-tokens", "8", "--start-timeout", "240"),
            *("--engine-extra", '{"cuda_graph_max_bs": 2}', "--attention-backend", "triton"),
            *("--py-spy", spy, "--py-spy-rounds", "1"),
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in (out / "stacks").glob("*.txt")) == ["patched-bs4-r1.txt", "pristine-bs4-r1.txt"]
    result = json.loads((out / "duel.json").read_text())
    pids = {json.loads((out / "stacks" / f"{n}-bs4-r1.txt.argv").read_text())[2] for n in ("pristine", "patched")}
    assert len(pids) == 2 and len(result["calls"]) == 4  # each engine's own runner, every call timed


def test_a_py_spy_that_is_not_there_is_refused_before_any_engine_starts(tmp_path, capsys):
    with pytest.raises(SystemExit):
        duel.parser().parse_args(
            ["--out", str(tmp_path), "--engine", "a=b:1:pristine", "--py-spy", str(tmp_path / "no")]
        )
    assert "no such program" in capsys.readouterr().err
    assert py_stacks.program(_fake_py_spy(tmp_path)) == str(tmp_path / "py-spy")
