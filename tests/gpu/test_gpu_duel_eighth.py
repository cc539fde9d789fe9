"""docs/gpu.md's eighth run (issues 67 and 71, 2026-11-28h): its tables recomputed from the
committed JSON (docs/results/gpu-duel-2026-11-28h), and the figures its text cites read back."""

from __future__ import annotations

import statistics
from pathlib import Path

import duel_runs

from gpu_e2e import duel_report

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28h"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "55382cb1edb720081c683bafa6302c0d2f960f04"
FA3_8B = ("fa3_8b_duel-r1", "fa3_8b_duel-r2", "fa3_8b_duel-r3")
GRID = ("triton_duel-r1", *FA3_8B)
FLASHINFER = ("flashinfer_duel-r1", "flashinfer_ds_duel-r1")
EVERY = (*GRID, *FLASHINFER, "ds_dp_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def test_every_duel_is_of_its_commit_and_its_summary_is_its_calls():
    for name in EVERY:
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)


def test_the_tables_are_the_runs():
    lines = duel_report.grid_lines({name: _run(name) for name in GRID})
    lines += duel_report.grid_lines({"triton_duel-r1": _run("triton_duel-r1")}, ("patched:patched-again",))
    lines += duel_report.grid_lines({"ds_dp_duel-r1": _run("ds_dp_duel-r1")}, ("pristine:patched",))
    lines += duel_report.grid_lines(
        {name: _run(name) for name in FLASHINFER}, ("pristine:patched-graph", "upstream:patched-graph")
    )
    assert len(lines) == 36
    for line in lines:
        assert line in DOC, line


def test_fa3_8b_pooled_over_its_three_duels():
    results = [_run(name) for name in FA3_8B]
    for pair in ("pristine:patched", "upstream:patched"):
        for row in duel_report.pooled(results, pair):
            line = (
                f"| {pair} | {row['batch_size']} | {row['rounds']} | {row['median']:.3f} | "
                f"{row['at_least_1']} | {row['min']:.3f} | {row['max']:.3f} |"
            )
            assert line in DOC, line


def test_deepseek_ran_at_tp_4_with_dp_attention_4():
    result = _run("ds_dp_duel-r1")
    args = result["args"]
    assert (args["tp"], args["dp"], args["dp_attention"], args["rounds"]) == (4, 4, True, 3)
    eager = {r["batch_size"]: r for r in result["summary"] if r["eager"]}
    assert list(eager) == [48] and [round(r, 3) for r in sorted(eager[48]["ratios"])] == [0.907, 1.017, 1.036]
    assert "(rounds\n  0.907, 1.017, 1.036)" in DOC
    assert "48 | eager | 1.017 / 1.002 | 3 | identical" in DOC


def test_a_bursts_first_generate_costs_nothing():
    """REPEATS=2: the second generate of a burst over its first, per engine, batch size and
    round; a thaw that cost the first generate would put these medians above 1."""
    for name in ("triton_duel-r1", "fa3_8b_duel-r1", *FLASHINFER):
        bursts: dict[tuple, list[float]] = {}
        for c in _run(name)["calls"]:
            bursts.setdefault((c["engine"], c["batch_size"], c["round"]), []).append(
                c["completion_tokens"] / c["elapsed_s"]
            )
        second_over_first = [b[1] / b[0] for b in bursts.values() if len(b) == 2]
        median = round(statistics.median(second_over_first), 3)
        assert 0.99 <= median <= 1.08, (name, median)
        assert f"| {name} | {len(second_over_first)} | {median:.3f} |" in DOC


def test_flashinfer_mla_waits_once_a_step_at_every_batch_size_now():
    mla = duel_runs.per_step(_run("flashinfer_ds_duel-r1"))
    assert [round(mla[("patched-graph-count", bs)]["per_step"], 2) for bs in (1, 8, 32, 64)] == [1.07] * 4
    for bs in (32, 64):  # eager: 1806 waits in call_begin_forward in 2026-11-28g, the prefills' 12 now
        w = mla[("patched-graph-count", bs)]
        assert w["sites"]["layers/attention/flashinfer_mla_backend.py:call_begin_forward"] == 12
        assert w["sites"]["speculative/eagle_info_v2.py:prepare_for_decode"] == w["decode_steps"]
    small = duel_runs.per_step(_run("flashinfer_duel-r1"))
    assert all(small[("patched-graph-count", bs)]["per_step"] <= 1.12 for bs in (1, 8, 32, 64, 128))
    assert "1.07 a decode step at every batch size" in DOC
