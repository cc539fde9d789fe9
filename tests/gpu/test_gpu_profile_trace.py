"""gpu_e2e/profile_trace.py and profile_run.py: GPU busy fraction from sglang's profiler traces (issue 57)."""

import gzip
import json

import pytest

from gpu_e2e import profile_run, profile_trace


def _kernel(name, ts, dur, stream=7, device=0):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": device,
        "tid": stream,
        "args": {"device": device, "stream": stream},
    }


def _events():
    """A 100 us window (a CPU op spans it) with kernels at 10-30 and 20-40 on two streams
    (overlap: 30 us busy), 50-60 and 80-90: busy 50 us, gaps 10 + 20, lead 10 and tail 10."""
    return [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 1000.0, "dur": 100.0, "pid": 1, "tid": 1},
        _kernel("gemm", 1010.0, 20.0, stream=7),
        _kernel("attn", 1020.0, 20.0, stream=9),
        _kernel("gemm", 1050.0, 10.0),
        _kernel("norm", 1080.0, 10.0),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1005.0, "dur": 3.0, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1045.0, "dur": 3.0, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1075.0, "dur": 2.0, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 1062.0, "dur": 4.0, "pid": 0, "tid": 7},
        {"ph": "s", "cat": "ac2g", "id": 1, "ts": 1005.0, "pid": 1, "tid": 1},
    ]


def _write(path, events, gz=True):
    data = json.dumps({"schemaVersion": 1, "traceEvents": events})
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data)


def test_overlapping_kernels_count_once_and_the_window_splits_into_busy_gaps_and_edges():
    s = profile_trace.summarize_events(_events(), steps=2)
    assert s["wall_us"] == 100.0
    assert s["kernels"] == 4 and s["kernel_sum_us"] == 60.0
    assert s["kernel_union_us"] == 50.0  # not 60: 20-30 ran on both streams
    assert s["busy_fraction"] == 0.5
    assert s["gaps"] == {"sum_us": 30.0, "count": 2, "largest_us": [20.0, 10.0], "lead_and_tail_us": 20.0}
    assert s["kernel_union_us"] + s["gaps"]["sum_us"] + s["gaps"]["lead_and_tail_us"] == s["wall_us"]
    assert s["memcpy_memset_us"] == 4.0
    assert s["per_step_ms"] == {"wall": 0.05, "kernels": 0.025, "gaps": 0.015, "kernel_launches": 2.0}
    assert [(k["name"], k["count"], k["sum_us"]) for k in s["top_kernels"]] == [
        ("gemm", 2, 30.0),
        ("attn", 1, 20.0),
        ("norm", 1, 10.0),
    ]
    assert s["top_kernels"][0]["share"] == 0.5
    assert s["runtime_calls"][0] == {"name": "cudaGraphLaunch", "count": 2, "sum_us": 6.0}


def test_without_a_step_count_there_is_no_per_step_split():
    s = profile_trace.summarize_events(_events())
    assert s["steps"] is None and "per_step_ms" not in s
    assert profile_trace.summarize_events([{"ph": "M", "name": "x"}]) == {"note": "no timed events in the trace"}
    host_only = profile_trace.summarize_events([e for e in _events() if e.get("cat") != "kernel"], steps=2)
    assert host_only["busy_fraction"] == 0.0 and host_only["note"].startswith("no kernel events")
    line = profile_trace.line("x", {"ranks": [{"rank": 0, **host_only}]})
    assert line.endswith("(no kernel events: the GPU activity was not recorded)")


def test_two_ranks_gzip_and_plain_the_decode_traces_chosen_over_prefill(tmp_path):
    _write(tmp_path / "1764.5-TP-0-DECODE.trace.json.gz", _events())
    late = [dict(e, ts=e["ts"] + 5) if "ts" in e else e for e in _events()]
    _write(tmp_path / "1764.5-TP-1-DECODE.trace.json", late, gz=False)
    _write(tmp_path / "1764.5-TP-0-EXTEND.trace.json.gz", [_kernel("prefill", 0.0, 1000.0)])
    out = profile_trace.summarize_dir(tmp_path, steps=2)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert all(r["busy_fraction"] == 0.5 and r["steps"] == 2 for r in out["ranks"])
    assert len(out["files"]) == 3 and "note" not in out
    line = profile_trace.line("upstream uniform bs=8", out)
    assert line.startswith("upstream uniform bs=8: TP0 GPU busy 50.0% of 0.10 ms = 2 steps x 0.050 ms")
    assert "| TP1 GPU busy 50.0%" in line and "top gemm 50%" in line


def test_a_trace_stopped_by_hand_has_no_stage_and_no_step_count(tmp_path):
    _write(tmp_path / "1764.5-TP-0.trace.json.gz", _events())
    out = profile_trace.summarize_dir(tmp_path, steps=20)
    assert out["ranks"][0]["busy_fraction"] == 0.5 and out["ranks"][0]["steps"] is None


def test_a_missing_or_broken_trace_is_a_note_not_a_crash(tmp_path):
    out = profile_trace.summarize_dir(tmp_path / "nothing", steps=2)
    assert out["ranks"] == [] and out["note"].startswith("no DECODE torch profiler trace under")
    assert profile_trace.line("patched bs=8", out).startswith("patched bs=8: profile: no DECODE")
    (tmp_path / "1764.5-TP-0-EXTEND.trace.json.gz").write_bytes(b"")
    assert "found 1764.5-TP-0-EXTEND.trace.json.gz" in profile_trace.summarize_dir(tmp_path)["note"]
    (tmp_path / "1764.5-TP-0-DECODE.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    out = profile_trace.summarize_dir(tmp_path, steps=2)
    assert out["ranks"][0]["note"].startswith("unreadable trace 1764.5-TP-0-DECODE.trace.json.gz")
    assert "TP0 unreadable trace" in profile_trace.line("x", out)


class _Engine:
    """Stands in for sglang.Engine's profiler calls: writes a decode trace like its scheduler."""

    def __init__(self, stops_itself=True, start_error=None):
        self.stops_itself, self.start_error, self.kwargs = stops_itself, start_error, None

    def start_profile(self, **kwargs):
        if self.start_error:
            raise self.start_error
        self.kwargs = kwargs

    def generate(self, engine, requests):
        assert engine is self and requests == ["r"]
        if self.stops_itself:
            _write(self._dir() / "1764.5-TP-0-DECODE.trace.json.gz", _events())

    def stop_profile(self):
        if self.stops_itself:
            raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
        _write(self._dir() / "1764.5-TP-0.trace.json.gz", _events())

    def _dir(self):
        from pathlib import Path

        return Path(self.kwargs["output_dir"])


def test_a_profile_that_stops_itself_after_num_steps_knows_its_steps(tmp_path):
    engine = _Engine()
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "old-TP-0-DECODE.trace.json.gz").write_bytes(b"stale")
    out = profile_run.profiled_generate(engine, engine.generate, ["r"], tmp_path / "p", 2, label="patched bs=8")
    assert engine.kwargs == {
        "activities": ["CPU", "GPU"],
        "with_stack": False,
        "record_shapes": False,
        "profile_by_stage": True,
        "output_dir": str(tmp_path / "p"),
        "num_steps": 2,
    }
    assert out["stopped_by"] == "num_steps" and out["files"] == ["1764.5-TP-0-DECODE.trace.json.gz"]
    assert out["ranks"][0]["per_step_ms"]["wall"] == 0.05
    assert out["line"].startswith("patched bs=8: TP0 GPU busy 50.0%")
    json.dumps(out)  # goes into results.json as it is


def test_a_profile_stopped_by_hand_or_refused_is_recorded_not_raised(tmp_path):
    engine = _Engine(stops_itself=False)
    out = profile_run.profiled_generate(engine, engine.generate, ["r"], tmp_path / "p", 20, label="x")
    assert out["stopped_by"] == "stop_profile" and out["ranks"][0]["steps"] is None
    refused = _Engine(start_error=RuntimeError("Profiling is already in progress.\nmore"))
    out = profile_run.profiled_generate(refused, refused.generate, ["r"], tmp_path / "q", 20, label="x")
    assert out["error"] == "RuntimeError: Profiling is already in progress."
    assert out["line"] == "x: profile failed: RuntimeError: Profiling is already in progress."


@pytest.mark.parametrize(
    "asked, decode_steps, runs, steps",
    [
        (20, 300, 3, 20),  # 100 steps a generate: all 20
        (20, 45, 3, 13),  # 15 a generate: 13, so the 14th decode batch stops the profile
        (20, 0, 3, 20),  # not counted: as asked
        (20, None, 3, 20),
    ],
)
def test_steps_to_profile_leaves_room_for_the_batch_that_stops_the_profile(asked, decode_steps, runs, steps):
    assert profile_run.steps_to_profile(asked, decode_steps, runs) == steps


class _ProfilingEngine(_Engine):
    """A stand-in ``sglang.Engine`` for the runner: generates, and profiles like sglang."""

    def __init__(self, **kwargs):
        super().__init__()
        self.calls = 0

    def generate(self, input_ids, sampling_params):
        self.calls += 1
        if self.kwargs:  # after start_profile: the profiled generate
            _write(self._dir() / "1764.5-TP-0-DECODE.trace.json.gz", _events())
        n = sampling_params["max_new_tokens"]
        return [
            {"output_ids": list(range(n)), "meta_info": {"completion_tokens": n, "spec_verify_ct": n}}
            for _ in input_ids
        ]

    def shutdown(self):
        pass


def test_the_runner_profiles_the_batch_it_is_asked_for_after_its_timed_generates(tmp_path, monkeypatch):
    import sys
    import types

    from gpu_e2e import runner

    made = []
    fake = types.ModuleType("sglang")
    fake.__file__ = str(tmp_path / "sglang" / "__init__.py")
    engine_module = types.ModuleType("sglang.srt.entrypoints.engine")
    engine_module.Engine = lambda **kw: made.append(_ProfilingEngine(**kw)) or made[-1]
    for name, module in {
        "sglang": fake,
        "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.entrypoints": types.ModuleType("sglang.srt.entrypoints"),
        "sglang.srt.entrypoints.engine": engine_module,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("PK_E2E_SYNC_DIR", raising=False)
    out = tmp_path / "r.json"
    assert (
        runner.main(
            [
                "--tree-parent",
                str(tmp_path),
                "--variant",
                "upstream",
                "--size",
                "small",
                "--draft",
                "dummy",
                "--batch-sizes",
                "1,2",
                "--runs",
                "3",
                "--max-new-tokens",
                "4",
                "--profile-batch",
                "2",
                "--models-dir",
                str(tmp_path / "m"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    batches = json.loads(out.read_text())["batches"]
    assert "profile" not in batches[0]
    profile = batches[1]["profile"]
    assert profile["options"]["num_steps"] == 20 and profile["stopped_by"] == "num_steps"
    assert profile["trace_dir"] == f"{out}.profile-uniform-bs2"
    assert profile["ranks"][0]["busy_fraction"] == 0.5
    assert profile["line"].startswith("upstream uniform bs=2: TP0 GPU busy 50.0%")
    # bs 1: warm-up, 3 timed and 3 first-token; bs 2: the same and the profiled one
    assert made[0].calls == 7 + 8
