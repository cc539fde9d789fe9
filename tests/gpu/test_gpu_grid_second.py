"""Issue 67's speed grid, second run (docs/results/gpu-grid-2026-11-28b/, docs/gpu.md "Second
run"): two H200s, small shape, FA3 five rounds and Triton two, 256 new tokens, 0.5.17 beside
in FA3's round 1, the counters on in one patched engine, and one eager FA3 pair under sglang's
profiler. Every figure the page quotes is recomputed here from the JSON. No GPU needed."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import grid, orchestrate, report, tables, wait_report
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUN = repo_root() / "docs" / "results" / "gpu-grid-2026-11-28b"
GPU_MD = repo_root() / "docs" / "gpu.md"
PAIRS = sorted(p.name for p in RUN.glob("*-b12") if "_count" not in p.name)


def _results(step: str) -> dict:
    return json.loads((RUN / step / "results.json").read_text())


def _section() -> str:
    return GPU_MD.read_text().split("### Second run")[1].split("\n### ")[0]


def _by_tree(step: str) -> dict:
    return {key.rsplit("/", 1)[1]: run for key, run in _results(step)["runs"].items()}


@pytest.mark.parametrize("step", PAIRS)
def test_each_rounds_table_is_recomputed_from_the_json(step):
    pick = _by_tree(step)
    rows = report.compare(grid.RELEASE, pick["pristine"], pick["patched"])
    assert orchestrate.tables(rows) == tables.text(RUN / step, "table.md")
    assert all(r["identical"] for r in rows)


def test_the_grid_in_gpu_md_is_the_jsons():
    table = grid.rows(RUN)
    assert len(table) == 5 * 5 + 1 + 2 * 5 and all(r["identical"] for r in table)
    assert grid.markdown(table) in _section()
    median = {(c, bs): grid.median_ratio(table, c, bs) for c, bs in {(r["cell"], r["batch_size"]) for r in table}}
    # FA3 over five rounds: every captured cell far above pristine, eager bs 64 below 0.98
    assert min(median[("fa3", bs)] for bs in (1, 8, 32)) > 1.4
    assert {k for k, v in median.items() if v < 0.98} == {("fa3", 64), ("triton", 1), ("triton", 64)}


def test_the_noise_the_page_quotes():
    # one engine's two timed generates of one batch (FA3 r3, pristine, bs 128): 3.24 s and 4.49 s
    (b128,) = [b for b in _by_tree("fa3-r3-b12")["pristine"]["batches"] if b["batch_size"] == 128]
    assert b128["elapsed_s"] == [3.2388, 4.4912]
    # Triton bs 64: the same tree 1.287x in one round, 0.598x in the other
    ratios = {r["round"]: r["ratio"] for r in grid.rows(RUN) if r["cell"] == "triton" and r["batch_size"] == 64}
    assert (round(ratios["r2"], 3), round(ratios["r3"], 3)) == (1.287, 0.598)


def test_patched_over_0517_in_round_1():
    patched = {b["batch_size"]: b["tok_per_s"] for b in _by_tree("fa3-r1-b12")["patched"]["batches"]}
    (upstream,) = _results("fa3-r1-b17")["runs"].values()
    ratio = {b["batch_size"]: round(patched[b["batch_size"]] / b["tok_per_s"], 2) for b in upstream["batches"]}
    assert ratio == {1: 1.40, 8: 1.61, 32: 1.56, 64: 1.58, 128: 1.33}
    assert "1.40, 1.61, 1.56, 1.58, 1.33" in _section()


def test_host_waits_by_torchs_count_in_every_batch_of_the_counted_engine():
    (run,) = _results("fa3_count-r1-b12")["runs"].values()
    assert run["variant"] == "patched" and run["rc"] == 0
    for b in run["batches"]:
        waits = sum(wait_report.blocking_sites(b["syncs"]).values())
        assert b["sync_debug_armed"] and b["decode_steps"] == 512
        assert waits == 16 and waits / b["decode_steps"] < 0.1  # start-up's prefill copies alone
    assert "16 over 512" in _section()


def test_the_profile_figures_are_the_jsons():
    per_step = {}
    for tree, run in _by_tree("fa3_prof-r1-b12").items():
        (prof,) = [b["profile"] for b in run["batches"] if b.get("profile")]
        rank = prof["ranks"][0]
        calls = {c["name"]: c for c in rank["runtime_calls"]}
        per_step[tree] = (
            rank["per_step_ms"]["kernels"],
            rank["per_step_ms"]["kernel_launches"],
            rank["per_step_ms"]["wall"],
            round(calls["cudaMemcpyAsync"]["count"] / rank["steps"], 1),
            round(calls["cudaLaunchKernel"]["sum_us"] / calls["cudaLaunchKernel"]["count"], 1),
        )
    assert per_step == {"pristine": (1.648, 287.0, 19.488, 35.8, 6.8), "patched": (1.645, 289.0, 30.824, 33.8, 9.5)}


def test_every_call_ran_the_tree_and_machine_the_page_names():
    for step in (*PAIRS, "fa3_count-r1-b12", "fa3-r1-b17"):
        data = _results(step)
        assert data["device"].startswith("NVIDIA H200")
        assert data["patchkit_commit"].startswith("4fe9287")
        if step.endswith("-b12"):
            assert tree_digest(data["trees"][grid.RELEASE]["patched_files_sha256"]) == "edff6024210016b1"
    for word in ("4fe9287", "edff6024210016b1", "H200"):
        assert word in _section()
