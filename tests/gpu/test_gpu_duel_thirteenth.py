"""docs/gpu.md's thirteenth run (issues 67 and 71, 2026-11-29d): Triton at both shapes, FA3
small and FlashInfer small, each beside 0.5.17, every engine on the same cores and rotated. Its
table recomputed from the committed JSON (docs/results/gpu-duel-2026-11-29d), and the figures
its text cites read back."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import duel_runs

from gpu_e2e import duel_stats

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-29d"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "e150ce4abb1845b1b601ddfde15bd23a749a82a2"
DUELS = ("triton_duel-r1", "triton_8b_duel-r1", "fa3_duel-r1", "flashinfer_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def _ratios(name: str, pair: str, bs: int) -> list[float]:
    (row,) = [r for r in _run(name)["summary"] if r["pair"] == pair and r["batch_size"] == bs]
    return row["ratios"]


def test_every_duel_is_of_its_commit_on_shared_cores_and_rotated():
    for name in DUELS:
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)
        assert result["args"]["cpus"] == [4, 5, 6, 7] and result["args"]["rotate"]
        assert "upstream" in result["engines"]  # 0.5.17 beside every duel
    args = json.loads((RUN / "plan-args.json").read_text())
    steps = [args["env"]["STEPS"], *(a["env"]["STEPS"] for a in args["also"])]
    assert args["kind"] == "nvidia-h200" and steps == list(DUELS)
    switch = {e["name"]: e["env"] for e in _run("flashinfer_duel-r1")["args"]["engine"]}
    assert switch["patched"] == {} and switch["patched-hostplan"] == {"PATCHKIT_FLASHINFER_HOST_INDPTR": "1"}


def test_the_verdict_table_is_the_runs():
    """Every pair at every batch size of the four duels, read by duel_stats (wall ratios)."""
    duel_runs.assert_verdict_rows(RUN, DUELS, DOC)


def test_triton_8b_eager_bs64_read_three_ways_as_cited():
    """Below the median bar by 0.005, at parity by its mean and by its total time."""
    ratios = _ratios("triton_8b_duel-r1", "pristine:patched", 64)
    geometric = math.exp(statistics.mean(math.log(x) for x in ratios))
    seconds = {
        e: sum(c["elapsed_s"] for c in _run("triton_8b_duel-r1")["calls"] if c["batch_size"] == 64 and c["engine"] == e)
        for e in ("pristine", "patched")
    }
    figures = (
        round(statistics.median(ratios), 3),
        round(geometric, 3),
        round(seconds["pristine"] / seconds["patched"], 3),
    )
    assert figures == (0.975, 0.992, 0.999)
    assert "0.975 over 16 rounds, its geometric mean 0.992 and its\n  total time 0.999" in DOC
    spread = {
        r["engine"]: r["max_over_min"] for r in duel_stats.spread(_run("triton_8b_duel-r1")) if r["batch_size"] == 64
    }
    assert spread == {"patched": 1.674, "pristine": 2.06, "upstream": 1.819}
    assert "moves 1.67-2.06x" in DOC


def test_eager_calls_are_host_bound_as_cited():
    """At Triton 8B eager bs 64 each call's engine CPU time is its wall time, give or take 0.1 s."""
    calls = [c for c in _run("triton_8b_duel-r1")["calls"] if c["batch_size"] == 64]
    assert len(calls) == 48 and all(abs(c["host"]["engine_cpu_s"] - c["elapsed_s"]) <= 0.12 for c in calls)


def test_the_flashinfer_research_table_is_the_run():
    doc = (ROOT / "docs" / "research" / "flashinfer-spec-v2.md").read_text()
    pairs = ("pristine:patched", "pristine:patched-hostplan", "patched:patched-hostplan", "upstream:patched")
    for bs in (1, 8, 128):
        cells = " | ".join(f"{statistics.median(_ratios('flashinfer_duel-r1', p, bs)):.3f}" for p in pairs)
        assert f"| {bs} | {cells} |" in doc
