"""The recorded H100 runs of issue 53 (docs/results/gpu-hw-2026-11-26/, docs/gpu.md's
section "Host waits by torch's count"): every step's table.md and speed.md recomputed
from its results.json, torch's host-wait verdict recomputed, and the patched trees'
digest. No GPU needed."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpu_e2e import orchestrate, report, wait_report
from gpu_e2e.bundle import repo_root

RUNS = repo_root() / "docs" / "results" / "gpu-hw-2026-11-26"
STEPS = sorted(p.parent.name for p in RUNS.glob("*/table.md"))


def _results(step: str) -> dict:
    return json.loads((RUNS / step / "results.json").read_text())


def _rows(data: dict) -> list[dict]:
    """Pristine against patched per release, size and round, in the orchestrator's order."""
    rows = []
    runs = data["runs"]
    for key in sorted(k for k in runs if k.endswith("/pristine")):
        other = key[: -len("pristine")] + "patched"
        if runs[key].get("batches") and runs.get(other, {}).get("batches"):
            rows.extend(report.compare(key.split("/")[0], runs[key], runs[other]))
    return rows


def digest(files: dict) -> str:
    lines = "".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


@pytest.mark.parametrize("step", STEPS)
def test_tables_recomputed_from_the_json(step):
    data = _results(step)
    rows = _rows(data)
    assert rows, step
    assert orchestrate.tables(rows) == (RUNS / step / "table.md").read_text()
    if (RUNS / step / "speed.md").exists():
        assert report.speed_markdown(rows) == (RUNS / step / "speed.md").read_text()
    # torch's verdict as the run wrote it
    assert [p for p in data["problems"] if p in wait_report.problems(rows)] == wait_report.problems(rows)
    assert all(r["identical"] for r in rows)


def test_the_patched_tree_is_one_and_the_same_in_every_step():
    digests = {digest(_results(s)["trees"]["0.5.12.post1"]["patched_files_sha256"]) for s in STEPS}
    assert digests == {"6b44ed3cad69caf1"}


def _waits(step: str) -> dict:
    """(workload, bs) -> [(pristine, patched) host waits per step, one per round]."""
    out: dict = {}
    for r in _rows(_results(step)):
        out.setdefault((r["workload"], r["batch_size"]), []).append(
            tuple(round(x, 2) for x in r["waits"]["per_step"]))
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
