"""docs/gpu.md's seventh run (issues 67 and 71, 2026-11-28g): its tables recomputed from the
committed JSON (docs/results/gpu-duel-2026-11-28g), and the figures its text cites read back."""

from __future__ import annotations

from pathlib import Path

import duel_runs

from gpu_e2e import duel_report

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28g"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "6a5aced6c4f3dc20f0b88e2ec8a4bc440871db5e"
GRID = ("fa3_duel-r1", "fa3_8b_duel-r1", "triton_duel-r1")
FLASHINFER = ("flashinfer_duel-r1", "flashinfer_ds_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def test_every_duel_is_of_its_commit_and_its_summary_is_its_calls():
    for name in GRID + FLASHINFER:
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)


def test_the_tables_are_the_runs():
    grid = {name: _run(name) for name in GRID}
    lines = duel_report.grid_lines(grid)
    lines += duel_report.grid_lines({n: grid[n] for n in ("fa3_duel-r1", "triton_duel-r1")}, ("patched:patched-again",))
    lines += duel_report.grid_lines(
        {name: _run(name) for name in FLASHINFER}, ("pristine:patched-graph", "upstream:patched-graph")
    )
    assert len(lines) == 34
    for line in lines:
        assert line in DOC, line


def test_one_generates_rate_moves_up_to_twice_between_rounds():
    rates = {
        c["round"]: round(c["completion_tokens"] / c["elapsed_s"])
        for c in _run("fa3_8b_duel-r1")["calls"]
        if c["engine"] == "pristine" and c["batch_size"] == 128
    }
    assert (rates[1], rates[5]) == (4987, 2607)
    assert "4987 tok/s in round 1, 2607 in\n  round 5" in DOC


def test_flashinfer_waits_are_the_mirror_and_mla_eager_waits_in_its_plans():
    small = duel_runs.per_step(_run("flashinfer_duel-r1"))
    assert all(1.1 <= small[("patched-graph-count", bs)]["per_step"] <= 1.12 for bs in (1, 8, 32, 64, 128))
    mla = duel_runs.per_step(_run("flashinfer_ds_duel-r1"))
    assert [round(mla[("patched-graph-count", bs)]["per_step"], 2) for bs in (1, 8, 32, 64)] == [
        1.07,
        1.07,
        10.07,
        10.07,
    ]
    for bs in (32, 64):
        w = mla[("patched-graph-count", bs)]
        assert w["decode_steps"] == 200
        assert w["sites"]["layers/attention/flashinfer_mla_backend.py:call_begin_forward"] == 1806
    facts = duel_report.ran_with(_run("flashinfer_ds_duel-r1"))
    assert [f["attn_backend"] for f in facts] == [["FlashInferMLAAttnBackend"]]
    assert "10.07 eager (bs 32, 64)" in DOC and "waits 1806\n  times in 200 steps" in DOC
