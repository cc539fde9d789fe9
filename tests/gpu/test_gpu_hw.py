"""The recorded H100 runs of issue 53 (docs/results/gpu-hw-2026-11-26/ and, the second
lease, gpu-hw-2026-11-27/; docs/gpu.md's section "Host waits by torch's count"): every
step's table.md and speed.md recomputed from its results.json, torch's host-wait verdict
recomputed, the patched trees' digest, and the second lease's rows in docs/gpu.md. No GPU
needed."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import orchestrate, report, tables, wait_report
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUNS = repo_root() / "docs" / "results" / "gpu-hw-2026-11-26"
STEPS = sorted(p.parent.name for p in RUNS.glob("*/results.json"))
RUNS2 = repo_root() / "docs" / "results" / "gpu-hw-2026-11-27"  # the second lease
STEPS2 = sorted(p.parent.name for p in RUNS2.glob("*/results.json"))


def _results(step: str, runs=RUNS) -> dict:
    return json.loads((runs / step / "results.json").read_text())


def _rows(data: dict) -> list[dict]:
    """Pristine against patched per release, size and round, in the orchestrator's order."""
    rows = []
    runs = data["runs"]
    for key in sorted(k for k in runs if k.endswith("/pristine")):
        other = key[: -len("pristine")] + "patched"
        if runs[key].get("batches") and runs.get(other, {}).get("batches"):
            rows.extend(report.compare(key.split("/")[0], runs[key], runs[other]))
    return rows


@pytest.mark.parametrize("runs,step", [(RUNS, s) for s in STEPS] + [(RUNS2, s) for s in STEPS2])
def test_tables_recomputed_from_the_json(runs, step):
    data = _results(step, runs)
    rows = _rows(data)
    assert rows, step
    assert orchestrate.tables(rows) == tables.text(runs / step, "table.md")
    speed = tables.text(runs / step, "speed.md")
    if speed is not None:
        assert report.speed_markdown(rows) == speed
    # torch's verdict as the run wrote it
    assert [p for p in data["problems"] if p in wait_report.problems(rows)] == wait_report.problems(rows)
    assert all(r["identical"] for r in rows)


def test_the_patched_tree_is_one_and_the_same_in_every_step():
    digests = {tree_digest(_results(s)["trees"]["0.5.12.post1"]["patched_files_sha256"]) for s in STEPS}
    assert digests == {"6b44ed3cad69caf1"}


def _waits(step: str) -> dict:
    """(workload, bs) -> [(pristine, patched) host waits per step, one per round]."""
    out: dict = {}
    for r in _rows(_results(step)):
        out.setdefault((r["workload"], r["batch_size"]), []).append(tuple(round(x, 2) for x in r["waits"]["per_step"]))
    return out


@pytest.mark.parametrize("step", ["s12-fa3", "b12-fa3", "s12-triton"])
def test_prepare_for_decode_waits_no_more_and_what_remains_is_in_both(step):
    eager = 1.0 if step == "s12-triton" else 0.0  # Triton's eager verify sizes kv_indices on the host
    for (workload, bs), rounds in _waits(step).items():
        extra = (1.0 if workload == "penalized" else 0.0) + (eager if bs == 16 else 0.0)
        assert set(rounds) == {(5.05 + extra, 1.05 + (eager if bs == 16 else 0.0))}, (workload, bs)
    for r in _rows(_results(step)):
        sites = r["waits"]["sites"]
        pfd = sites["sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"]
        assert pfd["per_step"][1] == 0.0 and pfd["per_step"][0] == (4.0 if r["workload"] == "penalized" else 3.0)
        # what the patched tree still does once a step, pristine does too (twice): the draft
        # extend's pageable non_blocking copies, which torch does not call a sync
        init = sites["sglang/srt/model_executor/forward_batch_info.py:init_new"]
        assert init["kinds"][1] == {"h2d-nb": init["count"][1]} and round(init["per_step"][1], 2) == 1.02
        assert r["waits"]["new"] == [] and r["new_wait_sites_whole_run"] == []
        assert tuple(round(x, 2) for x in r["waits"]["wrapper_per_step"]) == (4.0, 3.0)  # the cross-check


def test_speed_per_workload_over_the_rounds():
    """docs/gpu.md's tok/s: median over the processes, ratio per round, by workload."""
    got = {}
    for step in ("s12-fa3", "s12-triton"):
        for r in _rows(_results(step)):
            got.setdefault((step, r["workload"], r["batch_size"]), []).append(round(r["ratio"], 3))
    assert got[("s12-fa3", "uniform", 8)] == [1.492, 1.541]
    assert got[("s12-fa3", "penalized", 8)] == [1.503, 1.689]
    assert got[("s12-triton", "uniform", 16)] == [1.203, 1.104]


# The second lease (2026-11-27): main at e6ad8de, init_new's copies pinned and
# triton-spec-v2-verify in the bundle.

PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
INIT_NEW = "sglang/srt/model_executor/forward_batch_info.py:init_new"
TRITON_VERIFY = "sglang/srt/layers/attention/triton_backend.py:init_forward_metadata"
ADMISSION = {  # run once per prefill batch (a request's admission), never per decode step
    "sglang/srt/mem_cache/common.py:alloc_for_extend",
    "sglang/srt/mem_cache/common.py:write_cache_indices",
    "sglang/srt/sampling/sampling_batch_info.py:from_schedule_batch",
}
PENALIZERS = {
    "sglang/srt/sampling/penaltylib/frequency_penalty.py:_prepare",
    "sglang/srt/sampling/penaltylib/presence_penalty.py:_prepare",
}


def _served_as(data: dict, bs: int) -> str:
    """How the engine served a batch of bs requests, from the settings read back."""
    facts = {k: data["runs"][k]["engine_facts"][0] for k in data["runs"]}
    ((max_bs, running),) = {(f["cuda_graph_max_bs"], f["max_running_requests"]) for f in facts.values()}
    at_a_time = min(bs, running)
    graph = "captured" if at_a_time <= max_bs else "eager"
    return f"{at_a_time} at a time, {graph} (`cuda_graph_max_bs` {max_bs})"


def _pair(sites: dict, site: str) -> str:
    if site not in sites:
        return "–"
    a, b = sites[site]["per_step"]
    return f"{a:.2f} → {b:.2f}"


def second_lease_rows() -> list[str]:
    """docs/gpu.md's table of the second lease, one line per workload and batch size."""
    lines = []
    for step in STEPS2:
        data = _results(step, RUNS2)
        for r in _rows(data):
            w = r["waits"]
            cells = [
                f"`{step}`",
                r["workload"],
                str(r["batch_size"]),
                _served_as(data, r["batch_size"]),
                str(w["decode_steps"][0]),
                "{:.2f} → {:.2f}".format(*w["per_step"]),
                _pair(w["sites"], PFD),
                _pair(w["sites"], INIT_NEW),
                _pair(w["sites"], TRITON_VERIFY),
                "{:.2f} → {:.2f}".format(*w["wrapper_per_step"]),
                "{:.1f} → {:.1f} ({:.3f})".format(*r["tok_per_s"], r["ratio"]),
                "yes" if r["identical"] else "no",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_second_lease_rows_in_the_doc_come_from_the_json():
    doc = (repo_root() / "docs" / "gpu.md").read_text()
    rows = second_lease_rows()
    assert len(rows) == 8 and STEPS2 == ["s12-maxbs", "s12-triton"]
    assert [row for row in rows if row not in doc] == []


def test_second_lease_device_bundle_and_digest():
    for step in STEPS2:
        data = _results(step, RUNS2)
        assert data["device"].startswith("NVIDIA H100 80GB HBM3")
        assert data["patchkit_commit"].startswith("e6ad8de")
        assert tree_digest(data["trees"]["0.5.12.post1"]["patched_files_sha256"]) == "132d33dfb0036dbf"
        assert data["problems"] == []


def test_second_lease_no_wait_on_a_decode_step():
    """Patched: prepare_for_decode, init_new and Triton's eager verify at 0; what is left
    fires once per prefill batch, alike in pristine, and the prefill batches are the
    decode steps / 256 new tokens: none of it runs on a decode step."""
    for step in STEPS2:
        for r in _rows(_results(step, RUNS2)):
            w = r["waits"]
            sites, steps = w["sites"], w["decode_steps"][1]
            assert r["identical"] and w["new"] == [] and r["new_wait_sites_whole_run"] == []
            assert sites[PFD]["count"][1] == sites[INIT_NEW]["count"][1] == 0
            assert sites.get(TRITON_VERIFY, {"count": (0, 0)})["count"][1] == 0
            left = {s: e for s, e in sites.items() if e["count"][1]}
            assert set(left) == ADMISSION | (PENALIZERS if r["workload"] == "penalized" else set())
            prefills = steps // 256
            assert prefills * 256 == steps
            for e in left.values():
                assert e["count"] == (len(e["lines"][1]) * prefills,) * 2 and e["lines"][0] == e["lines"][1]
            eager = TRITON_VERIFY in sites
            assert eager == (step == "s12-triton" and r["batch_size"] == 16)
            before = 5.0 + (r["workload"] == "penalized") + eager
            assert round(w["per_step"][0] - before, 2) == 0.05


def test_second_lease_wrapper_counter_three_left_are_the_overlap_schedulers():
    """4.00 -> 3.00: pristine's seq_lens .cpu() gone; the 3 left are event waits of the
    overlap scheduler's result path, pristine and patched alike."""
    for step in STEPS2:
        for r in _rows(_results(step, RUNS2)):
            steps = r["waits"]["decode_steps"]
            assert r["prepare_per_step"] == (1.0, 0.0)
            a, b = r["other_sites"]
            assert a == b
            per = {k: round(v / steps[1], 2) for k, v in b.items()}
            assert per == {
                "wait sglang/srt/managers/schedule_batch.py:maybe_wait_verify_done": 2.0,
                "wait sglang/srt/managers/scheduler_output_processor_mixin.py:process_batch_result_decode": 1.0,
                "wait sglang/srt/managers/scheduler_output_processor_mixin.py:process_batch_result_prefill": 0.0,
            }
