"""docs/gpu.md's fifth run (issues 72, 71 and 67, 2026-11-28e): its table recomputed from the
committed JSON (docs/results/gpu-duel-2026-11-28e), and the figures its text cites read back."""

from __future__ import annotations

import json
from pathlib import Path

import duel_runs

from gpu_e2e import duel_report, profile_compare

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28e"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "b6571a60dca36be32c8f43e062bd66ef293ff78d"


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def test_every_duel_is_of_its_commit_and_its_summary_is_its_calls():
    for name in ("dsa_duel-r1", "flashinfer_duel-r1", "flashinfer_8b_duel-r1"):
        result = _run(name)
        duel_runs.assert_recomputes(result, COMMIT)
        # every engine that lived saw its variables (a dead one's runner wrote no record of them)
        assert all(e["env_ok"] for e in result["engines"].values() if "env" in e and e["failure"] is None)


def test_dsa_pristine_dies_at_an_eager_batch_and_patched_serves_every_one():
    result = _run("dsa_duel-r1")
    engines = result["engines"]
    assert engines["pristine"]["failure"].startswith("warm-up bs 32: engine gone")
    assert engines["pristine-blocking"]["failure"].startswith("warm-up bs 32: engine gone")
    assert engines["pristine-count"]["failure"].startswith("round 1 bs 64: engine gone")
    assert [c["error"].split(";")[0] for c in result["calls"] if c["engine"] == "pristine-count" and "error" in c] == [
        "engine gone (EOFError)",
        "engine gone (BrokenPipeError)",
    ]
    log = (RUN / "dsa_duel-r1-engine-pristine-blocking.log").read_text()
    assert "_get_topk_paged" in log and "_draft_extend_for_decode" in log
    assert "smxx_fp8_fp4_paged_mqa_logits.hpp:158): 700 (CUDA_ERROR_ILLEGAL_ADDRESS" in log
    assert engines["patched"]["failure"] is None and engines["patched-count"]["failure"] is None
    patched = [(c["round"], c["batch_size"]) for c in result["calls"] if c["engine"] == "patched" and "error" not in c]
    assert sorted(patched) == [(r, bs) for r in (1, 2, 3) for bs in (1, 8, 32, 64)]
    for bs in (1, 8):  # where both trees ran: one output
        outs = duel_runs.outputs(result, bs)
        assert set(outs) == {"patched", "patched-count", "pristine-count"} and len(set.union(*outs.values())) == 1
    facts = {f["engine"]: f["draft_extend_graph_runner"] for f in duel_report.ran_with(result)}
    assert facts == {"patched-count": ["EAGLEDraftExtendCudaGraphRunner"], "pristine-count": ["None"]}


def test_dsa_waits_and_rates_are_as_cited():
    result = _run("dsa_duel-r1")
    waits = duel_runs.per_step(result)
    assert [round(waits[("pristine-count", bs)]["per_step"], 2) for bs in (1, 8)] == [8.07, 8.11]
    assert [round(waits[("patched-count", bs)]["per_step"], 2) for bs in (1, 8, 32, 64)] == [1.05, 1.09, 1.21, 1.36]
    for bs, method in ((1, "init_forward_metadata_replay_cuda_graph"), (32, "init_forward_metadata")):
        w = waits[("patched-count", bs)]
        assert w["sites"][f"layers/attention/nsa_backend.py:{method}"] == w["decode_steps"]
    rate = {(c["engine"], c["batch_size"]): c.get("decode_tok_per_s") for c in result["calls"] if c["round"] == 1}
    assert [round(rate[("patched-count", bs)] / rate[("pristine-count", bs)], 2) for bs in (1, 8)] == [1.96, 1.95]


def test_flashinfer_table_waits_and_8b_outputs_are_as_cited():
    small = _run("flashinfer_duel-r1")
    for line in duel_report.grid_lines(
        {"flashinfer_duel-r1": small}, ("pristine:patched-graph", "upstream:patched-graph")
    ):
        assert line in DOC, line
    assert all(r["identical"] for r in small["summary"])
    big = _run("flashinfer_8b_duel-r1")
    assert "before it was up" in big["engines"]["patched-graph"]["failure"] and not big["summary"]
    for result in (small, big):
        waits = duel_runs.per_step(result)
        assert all(2.1 <= waits[("patched-graph-count", bs)]["per_step"] <= 2.12 for bs in (1, 8, 32))
        assert all(5.0 <= waits[("patched-graph-count", bs)]["per_step"] <= 5.12 for bs in (64, 128))
        facts = duel_report.ran_with(result)
        assert [f["draft_extend_graph_runner"] for f in facts] == [["EAGLEDraftExtendCudaGraphRunner"]]
    for bs in (1, 8, 32, 64, 128):
        outs = duel_runs.outputs(big, bs)
        assert set(outs) == {"pristine", "upstream", "patched-graph-count"} and len(set.union(*outs.values())) == 1


def test_the_fa3_8b_eager_profile_is_as_cited():
    rep = json.loads((RUN / "fa3_8b_prof-r1-compare.json").read_text())
    (cell,) = rep["cells"].values()
    c = cell["compare"]
    assert c["wall_us"][:2] == [35042.1, 36323.7] and c["kernel_union_us"][:2] == [8731.2, 8743.9]
    assert all(abs(d) < 7 for _, _, d in c["categories_us"].values())
    assert set(profile_compare.markdown(rep).splitlines()) == set(
        (RUN / "fa3_8b_prof-r1-compare.md").read_text().splitlines()
    )
    for figure in ("8731.2 against 8743.9 us", "35.0 and 36.3 ms", "23.7 and 24.8 ms"):
        assert figure in DOC


def test_every_patched_engine_ran_the_same_43_files_as_cited():
    trees = [
        files
        for name in ("dsa_duel-r1", "flashinfer_duel-r1", "flashinfer_8b_duel-r1")
        for engine, files in _run(name)["patched_files_sha256"].items()
        if engine.startswith("patched")
    ]
    assert len(trees) == 6 and all(t == trees[0] for t in trees) and len(trees[0]) == 43
    for path, digest in (("nsa_backend.py", "69796a47afbd5291"), ("flashinfer_backend.py", "fd3fd1f7e8de4eb3")):
        assert trees[0][f"srt/layers/attention/{path}"].startswith(digest)
        assert f"`{path}` {digest}…" in DOC
    others = [
        files
        for name in ("dsa_duel-r1", "flashinfer_duel-r1", "flashinfer_8b_duel-r1")
        for engine, files in _run(name)["patched_files_sha256"].items()
        if not engine.startswith("patched")
    ]
    assert others and all(files == {} for files in others)
