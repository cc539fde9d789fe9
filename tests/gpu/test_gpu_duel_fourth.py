"""docs/gpu.md's fourth run of the grid (issues 67 and 71, 2026-11-28d): its tables recomputed
from the committed duel JSON (docs/results/gpu-duel-2026-11-28d), and the figures its text
cites read back from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_e2e import duel_report, evidence

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28d"
DOC = (ROOT / "docs" / "gpu.md").read_text()
DUELS = [
    "fa3_duel-r1",
    "fa3_8b_duel-r1",
    "triton_duel-r1",
    "triton_8b_duel-r1",
    "flashinfer_duel-r2",
    "flashinfer_8b_duel-r2",
    "flashinfer_ds_duel-r1",
]
FLASHINFER = DUELS[4:]


def _runs() -> dict[str, dict]:
    return {name: evidence.read_json(RUN / f"{name}.json") for name in DUELS}


@pytest.mark.parametrize("name", DUELS)
def test_each_summary_is_its_calls_and_every_output_is_one(name):
    result = _runs()[name]
    eager_above = json.loads(result["args"]["engine_extra"])["cuda_graph_max_bs"]
    pairs = duel_report.pairs_of(result["args"]["compare"])
    assert duel_report.summary(result["calls"], pairs, eager_above) == result["summary"]
    assert "H200" in result["device"] and all(e["failure"] is None for e in result["engines"].values())
    assert set(result["patchkit_commit"].values()) == {"f447c0a11c2830e98613b2bcb5e966716cc0a436"}
    assert all(r["identical"] for r in result["summary"])
    # every engine with variables of its own saw them in each of its processes
    assert all(e["env_ok"] for e in result["engines"].values() if "env" in e)


def test_the_grid_and_the_minus_and_flashinfer_tables_are_recomputed():
    runs = _runs()
    tables = [
        duel_report.grid_lines(runs, ("pristine:patched", "upstream:patched", "patched:patched-again")),
        duel_report.grid_lines(
            {n: runs[n] for n in ("fa3_duel-r1", "fa3_8b_duel-r1")},
            ("pristine:minus-fa3-spec-v2", "patched:minus-fa3-spec-v2"),
        ),
        duel_report.grid_lines(
            {n: runs[n] for n in FLASHINFER},
            ("pristine:patched-hostplan", "upstream:patched-hostplan", "patched:patched-hostplan"),
        ),
    ]
    for line in (line for table in tables for line in table):
        assert line in DOC, line


def test_the_minus_tree_is_its_own_and_the_host_waits_are_as_cited():
    runs = _runs()
    files = runs["fa3_duel-r1"]["patched_files_sha256"]
    assert (len(files["patched"]), len(files["minus-fa3-spec-v2"]), len(files["pristine"])) == (42, 41, 0)
    waits = {(w["engine"], w["batch_size"]): w["per_step"] for w in duel_report.waits(runs["fa3_duel-r1"]["calls"])}
    assert all(waits[("patched-count", bs)] <= 0.05 for bs in (1, 8, 32, 64, 128))
    assert all(waits[("pristine-count", bs)] > 5 for bs in (1, 8, 32, 64, 128))
    fi = {(w["engine"], w["batch_size"]): w for w in duel_report.waits(runs["flashinfer_duel-r2"]["calls"])}
    cited = {"pristine-count": (19.1, 25.1), "patched-count": (15.1, 19.1), "patched-hostplan-count": (8.1, 10.1)}
    for engine, (captured, eager) in cited.items():
        assert round(fi[(engine, 32)]["per_step"], 1) == captured and round(fi[(engine, 128)]["per_step"], 1) == eager
    packing = fi[("patched-hostplan-count", 32)]
    assert (
        round(
            packing["sites"]["_patchkit/backends/flashinfer_host_indptr.py:pack_mask_segments"]
            / packing["decode_steps"],
            1,
        )
        == 5.0
    )
    for name in DUELS:
        for w in duel_report.waits(runs[name]["calls"]):
            assert f"| {name} | {w['engine']} | {w['batch_size']} | {w['decode_steps']} | {w['per_step']:.3f} |" in DOC


def test_fa3_8b_eager_bs_64_is_slower_a_token_than_bs_128_in_every_tree():
    calls = [c for c in _runs()["fa3_8b_duel-r1"]["calls"] if c["batch_size"] in (64, 128)]
    for engine in ("pristine", "patched", "upstream", "minus-fa3-spec-v2"):
        rate = {
            bs: max(c["decode_tok_per_s"] for c in calls if c["engine"] == engine and c["batch_size"] == bs)
            for bs in (64, 128)
        }
        assert rate[64] < rate[128], engine
