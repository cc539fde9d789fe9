"""Issue 67's speed grid, first run (docs/results/gpu-grid-2026-11-28/, docs/gpu.md "The speed
grid"): two H100s, small shape, pristine against patched 0.5.12.post1 with seq-lens-host-bound,
FA3 and Triton, bs 1, 8, 32 captured and 64, 128 eager; the debug check of the bound on both
backends and the static bound beside. Every committed figure is recomputed from the JSON.
No GPU needed."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import grid, orchestrate, report, tables
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUN = repo_root() / "docs" / "results" / "gpu-grid-2026-11-28"
GPU_MD = repo_root() / "docs" / "gpu.md"
TIMED = ("fa3-r2-b12", "fa3-r3-b12", "triton-r2-b12", "triton-r3-b12")
ENV_STEPS = {
    "fa3_check-r1-b12": {"PATCHKIT_CHECK_SEQ_LEN_BOUND": "1"},
    "triton_check-r1-b12": {"PATCHKIT_CHECK_SEQ_LEN_BOUND": "1"},
    "fa3_static-r1-b12": {"PATCHKIT_SEQ_LEN_BOUND": "static"},
}


def _results(step: str) -> dict:
    return json.loads((RUN / step / "results.json").read_text())


def _section() -> str:
    return GPU_MD.read_text().split("## The speed grid")[1].split("\n## ")[0]


@pytest.mark.parametrize("step", TIMED)
def test_each_rounds_table_is_recomputed_from_the_json(step):
    runs = _results(step)["runs"]
    pick = {key.rsplit("/", 1)[1]: run for key, run in runs.items()}
    rows = report.compare(grid.RELEASE, pick["pristine"], pick["patched"])
    assert orchestrate.tables(rows) == tables.text(RUN / step, "table.md")
    assert all(r["identical"] for r in rows) and len(rows) == 5


def test_the_grid_in_gpu_md_is_the_jsons_and_opens_the_page():
    table = grid.rows(RUN)
    assert len(table) == 20 and all(r["identical"] for r in table)  # 2 backends x 2 rounds x 5 bs
    assert {r["batch_size"] for r in table if r["eager"]} == {64, 128}
    assert grid.markdown(table) in _section()
    assert GPU_MD.read_text().index("## The speed grid") < GPU_MD.read_text().index("## At a glance")
    # The one cell below 0.98 in both rounds, which the page names as not resolved.
    below = {(r["cell"], r["batch_size"]) for r in table if grid.median_ratio(table, r["cell"], r["batch_size"]) < 0.98}
    assert below == {("fa3", 128)}


@pytest.mark.parametrize("step", sorted(ENV_STEPS))
def test_the_env_steps_ran_every_batch_with_the_variable_seen_by_the_engine(step):
    data = _results(step)
    (run,) = data["runs"].values()
    assert run["rc"] == 0 and data["problems"] == []
    assert [b["batch_size"] for b in run["batches"]] == [1, 8, 32, 64, 128]
    assert run["engine_env"] == ENV_STEPS[step]
    seen = list(run["engine_env_seen"].values())
    assert len(seen) >= 2 and all(s == ENV_STEPS[step] for s in seen)


def test_every_call_ran_the_tree_and_machine_gpu_md_names():
    for step in (*TIMED, *ENV_STEPS):
        data = _results(step)
        assert data["device"].startswith("NVIDIA H100 80GB HBM3")
        assert data["patchkit_commit"].startswith("a6b34ab")
        assert tree_digest(data["trees"][grid.RELEASE]["patched_files_sha256"]) == "5272a3d08fef244c"
    for word in ("a6b34ab", "5272a3d08fef244c", "H100"):
        assert word in _section()
