"""Issue 57's first GPU rounds (docs/results/gpu-yardstick-2026-11-27), read again on CPU:
a call with one variant has no pair and is OK where its engines ran; 0.5.17's graph setup
(target and draft prefill graphs, ``breakable``; draft decode, ``full``) is read back from
its own log lines and runners, while 0.5.10–0.5.13's reading stays as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_e2e import call_verdict

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu-yardstick-2026-11-27"


def _results(step: str) -> dict:
    return json.loads((RESULTS / step / "results.json").read_text())


# ------------------------------------------------------------------ the verdict

@pytest.mark.parametrize("step,variant", [("fa3-r2-b17", "upstream"), ("fa3-r2-b12", "patched")])
def test_a_call_with_one_variant_that_ran_is_ok_with_a_note(step, variant):
    results = _results(step)
    assert not results["rows"] and not results["problems"]  # what read NOT OK
    assert call_verdict.verdict(results)
    assert results["notes"] == [f"one variant ({variant}): no pair to compare in this call; "
                                "its comparison is made across calls"]


def test_a_call_whose_engine_failed_stays_not_ok():
    results = _results("fa3-r1-b17-no-deep-gemm")
    assert not call_verdict.verdict(results) and results["notes"] == []
    ran_no_batches = _results("fa3-r2-b17")  # rc 0 but nothing measured: no PROBLEM line, still NOT OK
    for run in ran_no_batches["runs"].values():
        run["batches"] = []
    assert not call_verdict.verdict(ran_no_batches)
    problem = _results("fa3-r2-b12")
    problem["problems"].append("a problem")
    assert not call_verdict.verdict(problem) and problem["notes"] == []


def test_a_pair_is_ok_by_its_rows_and_needs_them():
    pair = _results("fa3-r1-b12")
    notes = list(pair["notes"])
    assert call_verdict.verdict(pair) and pair["notes"] == notes  # no one-variant NOTE
    assert call_verdict.variants_run(pair) == ["patched", "pristine"]
    pair["rows"] = []
    assert not call_verdict.verdict(pair)  # two variants, nothing compared
