"""GPU proof II on CPU (issue 23): workloads, the in-process mirror switch, its
statistics, and the three tables recomputed from results."""

from __future__ import annotations

import json
import math
import sys
import threading
import types

import pytest

from gpu_e2e import accept_probe, issue23_report, mirror_control, orchestrate, report, workloads
from gpu_e2e.bundle import repo_root

RECORDED = repo_root() / "docs" / "results" / "gpu-e2e"
PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
FILTER = "sglang/srt/managers/schedule_batch.py:filter_batch"


# ---------------------------------------------------------------- workloads


def test_mixed_workload_mixes_lengths_and_arrivals_reproducibly():
    reqs = workloads.mixed(32, vocab=1000, seed=8)
    assert reqs == workloads.mixed(32, vocab=1000, seed=8)
    lens = [r.max_new_tokens for r in reqs]
    prompts = [len(r.input_ids) for r in reqs]
    assert min(lens) >= 32 and max(lens) <= 512 and len(set(lens)) > 16
    assert min(prompts) >= 16 and max(prompts) <= 256 and len(set(prompts)) > 16
    assert sum(r.arrive_s == 0 for r in reqs) == 16 and workloads.staggered(reqs)
    assert len({r.arrive_s for r in reqs}) == 1 + workloads.WAVES
    capped = workloads.mixed(8, vocab=1000, seed=8, max_new_tokens=64)
    assert max(r.max_new_tokens for r in capped) <= 64


def test_uniform_workload_is_the_first_proofs_traffic():
    reqs = workloads.build("uniform", 4, input_len=32, max_new_tokens=256, vocab=1000, seed=4)
    assert {len(r.input_ids) for r in reqs} == {32} and {r.max_new_tokens for r in reqs} == {256}
    assert not workloads.staggered(reqs)
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.build("bursty", 4, input_len=32, max_new_tokens=8, vocab=1000, seed=0)


def test_generate_sends_all_at_once_or_staggered():
    calls = []

    class Engine:
        def generate(self, input_ids, sampling_params):
            calls.append(("generate", len(input_ids), sampling_params))
            return [{"output_ids": [1]} for _ in input_ids]

        async def async_generate(self, input_ids, sampling_params):
            calls.append(("async", len(input_ids), sampling_params["max_new_tokens"]))
            return {"output_ids": [len(input_ids)]}

    uniform = workloads.uniform(3, input_len=4, max_new_tokens=5, vocab=100)
    assert len(workloads.generate(Engine(), uniform)) == 3
    assert calls[-1][0] == "generate" and calls[-1][2]["max_new_tokens"] == 5
    mixed = workloads.mixed(6, vocab=100, seed=1)
    outs = workloads.generate(Engine(), mixed)
    assert [o["output_ids"][0] for o in outs] == [len(r.input_ids) for r in mixed]  # request order kept
    assert sum(c[0] == "async" for c in calls) == 6


# ---------------------------------------------------------------- the switch


def test_abba_puts_each_arm_first_as_often_as_second():
    order = mirror_control.abba(20)
    assert len(order) == 40 and order[:4] == ["kept", "dropped", "dropped", "kept"]
    firsts = order[0::2]
    assert firsts.count("kept") == firsts.count("dropped") == 10
    assert all({a, b} == {"kept", "dropped"} for a, b in zip(order[0::2], order[1::2]))


def test_switch_reaches_the_runtime_module_of_the_process(tmp_path, monkeypatch):
    """The listener flips every loaded copy of the runtime's flag and answers; the
    tree's own decision comes back with "dropped"."""
    runtime = types.ModuleType("sglang.srt._patchkit.runtime.seq_lens")
    runtime._flag = False
    runtime.needs_cpu_seq_lens = lambda: runtime._flag
    runtime.set_needs_cpu_seq_lens = lambda v: setattr(runtime, "_flag", bool(v))
    # the only copy loaded here: another test module may have imported patchkit.runtime
    for name in [m for m in sys.modules if m.endswith(mirror_control.RUNTIME_SUFFIX)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, runtime.__name__, runtime)
    control = str(tmp_path / "mirror")
    assert mirror_control.install_listener(control, period=0.001, schedulers_only=False)
    switch = mirror_control.Switch(control, timeout=5)
    assert switch.set("kept")[0].startswith("kept 1 True own=False")
    assert runtime._flag is True
    # ABBA asks for the same arm twice in a row: each request is answered.
    for serial, arm in enumerate(mirror_control.abba(2)[1:], start=2):
        assert switch.set(arm)[0].startswith(f"{arm} {serial} {arm == 'kept'} own=False")
        assert runtime._flag is (arm == "kept")
    with pytest.raises(RuntimeError, match="no scheduler process"):
        mirror_control.Switch(str(tmp_path / "nobody"), timeout=0.05).set("kept")
    # A process that started no Scheduler (the engine's own) does not answer.
    other = str(tmp_path / "engine-process")
    mirror_control.install_listener(other, period=0.001)
    with pytest.raises(RuntimeError, match="no scheduler process"):
        mirror_control.Switch(other, timeout=0.1).set("kept")
    assert threading.active_count() >= 2


# ---------------------------------------------------------------- statistics


def test_paired_interval_on_recorded_like_samples():
    mean, lo, hi = mirror_control.paired_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    # t(3) = 3.182, sd = 1.291, n = 4
    assert math.isclose(hi - mean, 3.182 * 1.2909944 / 2, rel_tol=1e-5) and math.isclose(mean - lo, hi - mean)
    assert mirror_control.t95(19) == 2.093 and mirror_control.t95(200) == 1.96
    with pytest.raises(ValueError):
        mirror_control.t95(0)


def test_median_interval_is_the_sign_test_order_statistics():
    # n = 20: P(B <= 5) = 0.021 <= 0.025 < P(B <= 6), so the 6th and 15th smallest
    med, lo, hi = mirror_control.median_interval([float(x) for x in range(20, 0, -1)])
    assert (med, lo, hi) == (10.5, 6.0, 15.0)
    # one stalled call moves the median's interval by at most one rank
    assert mirror_control.median_interval([1.0] * 19 + [50.0]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        mirror_control.median_interval([1.0] * 5)


def _calls(kept_s: float, dropped_s: float, pairs: int = 20, noise: float = 0.002):
    calls = []
    for i, arm in enumerate(mirror_control.abba(pairs)):
        jitter = noise * ((i * 7919) % 11 - 5) / 5
        calls.append(
            {
                "arm": arm,
                "elapsed_s": (kept_s if arm == "kept" else dropped_s) + jitter,
                "decode_steps": 100,
                "prepare_syncs": 100 if arm == "kept" else 0,
                "syncs": 100 if arm == "kept" else 0,
                "accept_length": 1.0,
                "same_output": True,
            }
        )
    return calls


def test_summary_of_alternated_calls():
    s = mirror_control.summary_of_calls(_calls(1.03, 1.00))
    assert s["pairs"] == 20 and s["steps"] == 100 and s["identical_outputs"]
    assert s["prepare_syncs_per_step"] == {"kept": 1.0, "dropped": 0.0}
    d, lo, hi = s["saved_ms_per_step"]
    assert math.isclose(d, 0.3, abs_tol=0.02) and lo < d < hi and lo > 0
    q, qlo, qhi = s["ratio"]
    assert qlo < q < qhi < 1 and math.isclose(q, 1.0 / 1.03, rel_tol=0.01)
    same = mirror_control.summary_of_calls(_calls(1.0, 1.0))
    assert same["ratio"][1] < 1 < same["ratio"][2]  # no effect: the interval holds 1
    m, mlo, mhi = s["median_ratio"]
    assert mlo <= m <= mhi < 1
    leaky = _calls(1.03, 1.00)  # a late flush moved 7 steps (and syncs) into the next call
    leaky[0].update(decode_steps=93, prepare_syncs=93)
    leaky[1].update(decode_steps=107, prepare_syncs=7)
    assert mirror_control.summary_of_calls(leaky)["steps"] == 100  # each call's share of the total
    broken = _calls(1.0, 1.0)
    broken[1]["arm"] = "kept"
    with pytest.raises(ValueError, match="pairs"):
        mirror_control.summary_of_calls(broken)


# ---------------------------------------------------------------- tables


def _run(size, batches, scenario="eagle3", deterministic=False):
    return {"size": size, "scenario": scenario, "deterministic": deterministic, "batches": batches}


def _batch(bs, syncs, steps, workload="uniform", out=None, accept=1.0):
    return {
        "batch_size": bs,
        "workload": workload,
        "syncs": syncs,
        "decode_steps": steps,
        "tok_per_s": 100.0,
        "ms_per_token": 1.0,
        "accept_length": accept,
        "deterministic": True,
        "output_ids": out or [[1, 2]],
        "elapsed_s": [1.0],
    }


def test_traffic_table_side_by_side_and_the_gap_it_finds():
    pristine = _run("small", [_batch(32, {f"cpu|{PFD}:180": 500, f"item|{FILTER}:1900": 29}, 500, "mixed")])
    patched = _run("small", [_batch(32, {f"item|{FILTER}:1911": 29}, 500, "mixed")])
    upstream = _run("small", [_batch(32, {}, 500, "mixed")])
    res12 = {
        "runs": {
            "0.5.12.post1/small/triton/mixed/pristine": pristine,
            "0.5.12.post1/small/triton/mixed/patched": patched,
        }
    }
    res13 = {"runs": {"0.5.13/small/triton/mixed/upstream": upstream}}
    (row,) = issue23_report.traffic_rows([res12, res13])
    assert row["variants"]["pristine"]["per_step"] == {f"cpu {PFD}": 1.0, f"item {FILTER}": 0.058}
    assert issue23_report.traffic_gaps(row) == [f"item {FILTER}"]
    md = issue23_report.traffic_markdown([row])
    assert "upstream 0.5.13 (500 steps)" in md and f"| `item {FILTER}` | 0.058 | 0.058 | – |" in md
    assert "patched only: item" in md
    assert issue23_report.issue23_problems([res12, res13]) == [
        f"mixed small bs=32: patched syncs where upstream does not: item {FILTER}"
    ]
    patched["batches"][0]["syncs"] = {}
    assert issue23_report.issue23_problems([res12, res13]) == []
    # the same wait in a file upstream moved it to is no gap
    patched["batches"][0]["syncs"] = {
        "wait|sglang/srt/managers/scheduler_output_processor_mixin.py:process_batch_result_decode:474": 500
    }
    upstream["batches"][0]["syncs"] = {
        "wait|sglang/srt/managers/scheduler_components/batch_result_processor.py:process_batch_result_decode:380": 500
    }
    assert issue23_report.issue23_problems([res12, res13]) == []
    assert "same sites" in issue23_report.traffic_markdown(issue23_report.traffic_rows([res12, res13]))


def test_accepted_rows_and_cost_table():
    p = _run("small", [_batch(8, {f"cpu|{PFD}:1": 60}, 60, accept=4.0)], scenario="standalone")
    q = _run("small", [_batch(8, {}, 60, accept=4.0)], scenario="standalone")
    rows = report.compare("0.5.12.post1", p, q)
    assert rows[0]["scenario"] == "standalone" and "small standalone" in report.markdown(rows)
    res = {
        "runs": {"0.5.12.post1/small/triton/standalone/pristine": p, "0.5.12.post1/small/triton/standalone/patched": q}
    }
    assert issue23_report.accepted_rows([res]) == rows
    md = issue23_report.accepted_markdown(issue23_report.accepted_rows([res]))
    assert "| 0.5.12.post1 | small | standalone uniform | 8 | 4.00 / 4.00 | 1.00 → 0.00 |" in md
    alt = _run(
        "8b", [{"batch_size": 1, "workload": "uniform", "summary": mirror_control.summary_of_calls(_calls(1.03, 1.0))}]
    )
    res2 = {"runs": {"0.5.12.post1/8b/triton/alt20/patched": alt}}
    (cost,) = issue23_report.cost_rows([res2])
    assert cost["size"] == "8b" and cost["pairs"] == 20
    assert "| 0.5.12.post1 | 8b | eagle3 uniform | 1 | 20 | 100 | 1.00 → 0.00 |" in issue23_report.cost_markdown([cost])
    assert issue23_report.issue23_problems([res2]) == []
    assert issue23_report.issue23_problems([res]) == []
    q["batches"][0]["output_ids"] = [[1, 3]]
    assert issue23_report.issue23_problems([res]) == [
        "0.5.12.post1 small bs=8: outputs differ (request 0, token 1: 2 vs 3)"
    ]
    tables = issue23_report.issue23_tables([res, res2])
    assert "### Accepted runs" in tables and "### The sync's cost in one process" in tables


def test_orchestrator_key_names_only_what_differs():
    ns = types.SimpleNamespace
    base = dict(scenario="eagle3", deterministic=False, workloads="uniform", alternate=0, tp=1)
    assert orchestrate._setting(ns(**base)) == ""
    assert orchestrate._setting(ns(**{**base, "scenario": "standalone", "deterministic": True})) == "standalone-det/"
    assert orchestrate._setting(ns(**{**base, "workloads": "uniform,mixed", "alternate": 20})) == "uniform+mixed-alt20/"
    assert orchestrate._setting(ns(**{**base, "tp": 2})) == "tp2/"


def test_runner_engine_kwargs_for_the_accepted_scenario(tmp_path):
    from gpu_e2e import runner

    kw = runner.engine_kwargs(
        tmp_path / "t",
        tmp_path / "d",
        attention_backend="triton",
        cuda_graph_max_bs=8,
        mem_fraction_static=0.25,
        scenario="standalone",
        deterministic=True,
    )
    assert kw["speculative_algorithm"] == "STANDALONE"
    assert kw["speculative_draft_model_path"] == str(tmp_path / "t")  # the target is its own draft
    assert kw["enable_deterministic_inference"] is True
    kw = runner.engine_kwargs(
        tmp_path / "t", tmp_path / "d", attention_backend="triton", cuda_graph_max_bs=8, mem_fraction_static=0.6
    )
    assert kw["speculative_algorithm"] == "EAGLE3" and kw["speculative_draft_model_path"] == str(tmp_path / "d")
    assert "enable_deterministic_inference" not in kw


@pytest.mark.parametrize("run", sorted(p.name for p in RECORDED.glob("proof2-*/")) if RECORDED.exists() else [])
def test_recorded_proof2_runs_reproduce_their_tables(run):
    """The committed issue-23 results: recomputing the tables gives the committed ones."""
    folder = RECORDED / run
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("results*.json"))]
    assert issue23_report.issue23_tables(results) == (folder / "tables.md").read_text()


def test_host_waits_on_the_device_are_counted_by_site(monkeypatch):
    """Event/Stream.synchronize and torch.cuda.synchronize count as kind "wait"."""
    from gpu_e2e import syncs

    class Event:
        def synchronize(self):
            return "done"

    cuda = types.SimpleNamespace(
        Event=Event, Stream=type("Stream", (), {"synchronize": lambda self: None}), synchronize=lambda: None
    )
    monkeypatch.setattr(syncs, "_counts", syncs.Counter())
    syncs._wrap_waits(types.SimpleNamespace(cuda=cuda))
    code = compile(
        "def maybe_wait_verify_done(e):\n    return e.synchronize()\n",
        "/x/sglang/srt/managers/schedule_batch.py",
        "exec",
    )
    ns: dict = {}
    exec(code, ns)
    assert ns["maybe_wait_verify_done"](Event()) == "done"
    cuda.synchronize()
    counts = dict(syncs._counts)
    assert counts["wait|sglang/srt/managers/schedule_batch.py:maybe_wait_verify_done:2"] == 1
    assert sum(counts.values()) == 2 and syncs.syncs_only(counts) == counts


def test_accept_probe_tells_a_request_bound_acceptance_from_a_batch_size_one():
    alone = {"P1[0]": (1.01, [5, 6]), "P32[1]": (4.0, [7, 8]), "P32[0]": (2.0, [9])}
    same = accept_probe.summarise(alone, dict(alone))
    assert same["request_bound"] and same["accepting_alone"] == 1
    assert [r["prompt"] for r in same["rows"]] == ["P1[0]", "P32[0]", "P32[1]"]
    moved = accept_probe.summarise(alone, {**alone, "P1[0]": (4.0, [5, 6])})
    assert not moved["request_bound"]
    assert moved["rows"][0] == {
        "prompt": "P1[0]",
        "alone": 1.01,
        "batched": 4.0,
        "same_output": True,
        "same_accept": False,
    }


def test_first_token_only_asks_one_token_of_the_same_prompts_or_nothing():
    uniform = workloads.uniform(3, input_len=4, max_new_tokens=5, vocab=100)
    first = workloads.first_token_only(uniform)
    assert [r.input_ids for r in first] == [r.input_ids for r in uniform]
    assert {r.max_new_tokens for r in first} == {1}
    assert workloads.first_token_only(workloads.mixed(6, vocab=100, seed=1)) is None  # late arrivals
    assert workloads.first_token_only(workloads.uniform(2, input_len=4, max_new_tokens=1, vocab=100)) is None


def test_timed_runs_time_the_decode_alone_from_the_first_token_calls(monkeypatch):
    """Whole generates take 2.0 s, one-token generates 0.5 s: 4 requests x 255 tokens after
    the first in 1.5 s of decode."""
    from gpu_e2e import timed_calls

    def call(engine, requests):
        n = requests[0].max_new_tokens
        outs = [[7] * n for _ in requests]
        return {
            "elapsed_s": 2.0 if n > 1 else 0.5,
            "completion_tokens": n * len(requests),
            "verify_ct": 0,
            "output_ids": outs,
            "accept_per_request": [None] * len(requests),
        }

    monkeypatch.setattr(timed_calls, "_call", call)
    requests = workloads.uniform(4, input_len=8, max_new_tokens=256, vocab=100)
    batch = timed_calls.timed_runs(object(), requests, 3, None)
    assert batch["median_s"] == 2.0 and batch["first_token_s"] == [0.5, 0.5, 0.5]
    assert batch["decode_tok_per_s"] == pytest.approx(4 * 255 / 1.5)
    assert batch["tok_per_s"] == pytest.approx(4 * 256 / 2.0)
