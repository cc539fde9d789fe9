"""docs/gpu.md's sixth run (issues 72, 71 and 67, 2026-11-28f): its tables recomputed from the
committed JSON (docs/results/gpu-duel-2026-11-28f), and the figures its text cites read back."""

from __future__ import annotations

import json
from pathlib import Path

import duel_runs

from gpu_e2e import duel_report

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28f"
DOC = (ROOT / "docs" / "gpu.md").read_text()
LEASE_A, LEASE_B = "e9a6719f66b62f4977534f73b0c9342099caf80d", "ce2317fbd57162e92a26fe6572454dedc7cb6003"
DUELS = {"dsa_duel-r1": LEASE_A, "flashinfer_duel-r1-a": LEASE_A, "flashinfer_8b_duel-r1": LEASE_A}
DUELS["flashinfer_duel-r1"] = LEASE_B


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def test_every_duel_is_of_its_commit_and_its_summary_is_its_calls():
    for name, commit in DUELS.items():
        result = _run(name)
        duel_runs.assert_recomputes(result, commit)
        assert all(e["env_ok"] for e in result["engines"].values() if "env" in e and e["failure"] is None)


def test_dsa_decode_steps_wait_on_nothing_and_pristine_dies_eager():
    result = _run("dsa_duel-r1")
    waits = duel_runs.per_step(result)
    assert [round(waits[("patched-count", bs)]["per_step"], 3) for bs in (1, 8, 32, 64)] == [0.048, 0.085, 0.205, 0.365]
    assert [round(waits[("pristine-count", bs)]["per_step"], 2) for bs in (1, 8)] == [8.07, 8.1]
    for bs, requests in ((1, 4), (8, 11), (32, 35), (64, 67)):
        sites = waits[("patched-count", bs)]["sites"]
        assert not any("nsa_backend" in s or "eagle" in s or "forward_batch_info" in s for s in sites), sites
        assert sites["mem_cache/common.py:alloc_for_extend"] == requests  # one a request admitted
    engines = result["engines"]
    assert engines["pristine"]["failure"].startswith("warm-up bs 32: engine gone")
    assert engines["patched"]["failure"] is None and engines["patched-count"]["failure"] is None
    patched = sorted((c["round"], c["batch_size"]) for c in result["calls"] if c["engine"] == "patched")
    assert patched == [(r, bs) for r in (1, 2, 3) for bs in (1, 8, 32, 64)]
    assert all("error" not in c for c in result["calls"] if c["engine"].startswith("patched"))
    for bs in (1, 8):
        outs = duel_runs.outputs(result, bs)
        assert set(outs) == {"patched", "patched-count", "pristine-count"} and len(set.union(*outs.values())) == 1
    facts = {f["engine"]: f["draft_extend_graph_runner"] for f in duel_report.ran_with(result)}
    assert facts == {"patched-count": ["EAGLEDraftExtendCudaGraphRunner"], "pristine-count": ["None"]}
    rate = {(c["engine"], c["batch_size"]): c.get("decode_tok_per_s") for c in result["calls"] if c["round"] == 1}
    assert [round(rate[("patched-count", bs)] / rate[("pristine-count", bs)], 2) for bs in (1, 8)] == [1.27, 3.19]


def test_flashinfer_waits_are_the_mirror_and_its_table_is_as_cited():
    result = _run("flashinfer_duel-r1")
    for line in duel_report.grid_lines({"flashinfer_duel-r1": result}, ("pristine:patched-graph",)):
        assert line in DOC, line
    assert all(r["identical"] for r in result["summary"]) and len(result["summary"]) == 5
    waits = duel_runs.per_step(result)
    for bs in (1, 8, 32, 64, 128):
        w = waits[("patched-graph-count", bs)]
        assert w["sites"]["speculative/eagle_info_v2.py:prepare_for_decode"] == w["decode_steps"]  # the mirror
        rest = {s: n for s, n in w["sites"].items() if "prepare_for_decode" not in s}
        assert sum(rest.values()) == 22 and not any("flashinfer_host_indptr" in s for s in rest)
        assert 1.1 <= w["per_step"] <= 1.14
    facts = duel_report.ran_with(result)
    assert [f["draft_extend_graph_runner"] for f in facts] == [["EAGLEDraftExtendCudaGraphRunner"]]


def test_lease_a_flashinfer_lost_its_patched_engines_to_the_missing_k_lengths():
    log = (RUN / "flashinfer_duel-r1-a-engine-patched-graph.log").read_text()
    assert "AttributeError: 'HostPlan' object has no attribute 'kv_lens'" in log and "_with_kv_lens" in log
    for name in ("flashinfer_duel-r1-a", "flashinfer_8b_duel-r1"):
        result = _run(name)
        for engine in ("patched-graph", "patched-graph-count"):
            assert result["engines"][engine]["failure"].startswith("warm-up bs 1: engine gone")
        for bs in (1, 8, 32, 64, 128):  # pristine and 0.5.17 agree
            outs = duel_runs.outputs(result, bs)
            assert set(outs) == {"pristine", "upstream"} and len(set.union(*outs.values())) == 1


def test_the_two_profiled_orders_are_as_cited():
    cells = {}
    for r in ("r1", "r2"):
        rep = json.loads((RUN / f"fa3_8b_prof-{r}-compare.json").read_text())
        cells[r] = rep["cells"][f"0.5.12.post1_8b_default_{r}/uniform/bs64"]["compare"]
    assert cells["r1"]["wall_us"][:2] == [32383.2, 32182.4] and cells["r2"]["wall_us"][:2] == [42109.8, 65492.8]
    assert cells["r1"]["kernel_union_us"][:2] == [8791.6, 8806.4]
    assert cells["r2"]["kernel_union_us"][:2] == [8787.6, 8793.0]
    for r, ratio in (("r1", "1.026"), ("r2", "0.682")):
        assert "| 0.5.12.post1 | 8b | 64 |" in (RUN / f"fa3_8b_prof-{r}-table.md").read_text()
        assert f"| {ratio} |" in (RUN / f"fa3_8b_prof-{r}-table.md").read_text()
    for figure in (
        "8791.6 / 8806.4 us",
        "8787.6 / 8793.0 us",
        "| r1 | 32.4 ms | 32.2 ms |",
        "| r2 | 42.1 ms | 65.5 ms |",
    ):
        assert figure in DOC, figure
    # what ran beside each engine: the other lane's steps (progress-a.log) against the pair's times
    times = {r: (RUN / f"fa3_8b_prof-{r}-times.log").read_text() for r in ("r1", "r2")}
    assert "[13:01:30] start 0.5.12.post1/8b/default/r2/patched" in times["r2"]
    assert "[13:18:38] start 0.5.12.post1/8b/default/r1/patched" in times["r1"]
    progress = (RUN / "progress-a.log").read_text()
    assert (
        "[13:01:24] gpu 0: start dsa_duel-r1" in progress and "[13:18:33] gpu 0: end flashinfer_8b_duel-r1" in progress
    )


def test_every_patched_engine_ran_the_files_cited():
    lease_a = [
        files
        for name, commit in DUELS.items()
        if commit == LEASE_A
        for engine, files in _run(name)["patched_files_sha256"].items()
        if engine.startswith("patched")
    ]
    assert len(lease_a) == 6 and all(t == lease_a[0] for t in lease_a) and len(lease_a[0]) == 43
    for path, digest in (("nsa_backend.py", "496e093f0eeed120"), ("flashinfer_backend.py", "fd3fd1f7e8de4eb3")):
        assert lease_a[0][f"srt/layers/attention/{path}"].startswith(digest)
        assert " ".join(f"`{path}` {digest}…".split()) in " ".join(DOC.split())
    lease_b = _run("flashinfer_duel-r1")["patched_files_sha256"]["patched-graph"]
    changed = {path for path in lease_b if lease_b[path] != lease_a[0].get(path)}
    assert set(lease_b) == set(lease_a[0]) and changed == {
        "srt/_patchkit/backends/flashinfer_draft_extend_graph.py",
        "srt/_patchkit/backends/flashinfer_host_indptr.py",
        "srt/_patchkit/manifest.json",
    }
