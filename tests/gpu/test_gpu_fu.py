"""The recorded H100 runs of issues 42, 43 and 44 (docs/results/gpu-fu-2026-11-26/,
docs/gpu.md's section): each table and figure recomputed from its JSON, and the
per-step arithmetic of gpu_e2e/step_times.py on small records. No GPU needed."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import engine_facts, report, step_times, tables
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUNS = repo_root() / "docs" / "results" / "gpu-fu-2026-11-26"
TREES = ["before42", "mask-only", "patched"]
RESOLVE = "wait|sglang/srt/managers/overlap_utils.py:resolve_seq_lens_cpu"


def _results(step: str) -> dict:
    return json.loads((RUNS / step / "results.json").read_text())


def _section() -> str:
    text = (repo_root() / "docs" / "gpu.md").read_text()
    return text.split("## Tree drafts on spec v2, upstream's later fixes")[1].split("\n## ")[0]


# ---------------------------------------------------------------- step_times, on small records


def _batch(bs, elapsed, steps, ids):
    return {"batch_size": bs, "elapsed_s": elapsed, "decode_steps": steps, "output_ids": ids}


def test_step_times_take_per_round_differences_and_see_different_tokens():
    runs = {
        "r/8b/fa3/r0/a": {"batches": [_batch(8, [1.0, 1.2], 200, [[1]])]},
        "r/8b/fa3/r0/b": {"batches": [_batch(8, [0.9, 0.9], 200, [[1]])]},
        "r/8b/fa3/r1/b": {"batches": [_batch(8, [1.0, 1.0], 200, [[1]])]},
        "r/8b/fa3/r1/a": {"batches": [_batch(8, [1.0, 1.0], 200, [[2]])]},
    }
    assert step_times.step_ms(runs["r/8b/fa3/r0/a"]["batches"][0]) == [10.0, 12.0]
    (row,) = step_times.rows({"runs": runs}, "r", "8b", "fa3", ["a", "b"])
    assert row["median_ms"] == {"a": 10.0, "b": 9.5}
    assert row["saved_ms"]["a->b"] == [pytest.approx(2.0), pytest.approx(0.0)]
    assert row["identical"] is False  # one tree's tokens differ in round 1
    slim = step_times.slim({"runs": runs})
    assert "output_ids" not in slim["runs"]["r/8b/fa3/r0/a"]["batches"][0]
    assert step_times.rows(slim, "r", "8b", "fa3", ["a", "b"]) == [row]


# ---------------------------------------------------------------- issue 44: tree drafts, 0.5.13


def test_fa3_tree_drafts_on_0_5_13_are_identical_and_the_eager_batch_takes_its_own_mask():
    data = _results("t13-fa3")
    pristine, patched = (data["runs"][f"0.5.13/small/fa3/ctx8192/{v}"] for v in ("pristine", "patched"))
    facts = [engine_facts.in_force(r) for r in (pristine, patched)]
    assert {(f["attn_backend"], f["topk"], f["context_len"], f["piecewise"]) for f in facts} == {
        ("FlashAttentionBackend", "4", "8192", "on")
    }
    assert [f["draft_extend_graph_runner"] for f in facts] == ["None", "EAGLEDraftExtendCudaGraphRunner"]
    assert [r["engine_kwargs"]["cuda_graph_max_bs"] for r in (pristine, patched)] == [2, 2]
    masks = {b["batch_size"]: b["tree_mask"] for b in patched["batches"]}
    assert masks == {
        1: {"per_batch": 0, "preallocated": 128},
        2: {"per_batch": 0, "preallocated": 128},
        16: {"per_batch": 128, "preallocated": 0},
    }
    for before, after in zip(pristine["batches"], patched["batches"]):
        assert before["output_ids"] == after["output_ids"]
        waits = [{k: n for k, n in b["syncs"].items() if k.startswith(RESOLVE + ":")} for b in (before, after)]
        assert list(waits[0].values()) == [before["decode_steps"]] and waits[1] == {}  # one wait a step, pristine
    rows = report.compare("0.5.13", pristine, patched)
    assert report.markdown(rows) == tables.text(RUNS / "t13-fa3", "table.md")
    assert [f"{r['ratio']:.2f}" for r in rows] == ["1.61", "1.42", "1.37"]
    # the overrun the guard prevents: cells the tree kernel writes at bs 16 > the preallocated mask
    d, bs, seq = 8, 16, 1200
    assert d * bs * seq + bs * d * d > 2 * d * (8192 + d)


def test_with_no_backend_named_0_5_13_picks_flashinfer_for_topk_4():
    data = _results("t13-tree")
    for run in data["runs"].values():
        assert engine_facts.in_force(run)["attn_backend"] == "FlashInferAttnBackend"
    pristine, patched = (data["runs"][f"0.5.13/small/default/ctx8192/{v}"] for v in ("pristine", "patched"))
    assert [b["output_ids"] for b in pristine["batches"]] == [b["output_ids"] for b in patched["batches"]]
    check = _results("t13-memcheck")["runs"]["0.5.13/small/default/pw-off-ctx8192/patched"]
    assert check["rc"] == 0 and engine_facts.in_force(check)["attn_backend"] == "FlashInferAttnBackend"
    assert "ERROR SUMMARY: 0 errors" in (RUNS / "t13-memcheck" / "memcheck.2737.log").read_text()


# ---------------------------------------------------------------- issue 42: the 8B A/B


def test_the_8b_ab_table_is_the_json_and_the_page_tables_save_time_at_bs_48_in_both_rounds():
    data = _results("ab12-8b")
    rows = step_times.rows(data, "0.5.12.post1", "8b", "default", TREES)
    assert step_times.markdown(rows, TREES) in _section()
    assert all(r["identical"] for r in rows) and [r["bs"] for r in rows] == [8, 32, 48]
    bs48 = rows[-1]["saved_ms"]["mask-only->patched"]
    assert len(bs48) == 2 and all(0.2 < d < 0.3 for d in bs48)
    for run in data["runs"].values():
        f = engine_facts.in_force(run)
        assert (f["attn_backend"], f["context_len"], f["piecewise"]) == ("FlashAttentionBackend", "131072", "on")
        assert run["engine_kwargs"]["cuda_graph_max_bs"] == 48
    order = [k.split("/")[-1] for k in data["runs"]]
    assert sorted(order) == sorted(TREES * 2)


# ---------------------------------------------------------------- issue 43: 0.5.9


def test_0_5_9_is_served_with_identical_outputs_and_the_sync_gone():
    section = _section()
    for step in ("p9/run3", "p9/rounds"):
        data = _results(step)
        assert data["rows"] and all(r["identical"] for r in data["rows"])
        assert {(r["batch_size"], *r["prepare_per_step"]) for r in data["rows"]} == {(1, 1.0, 0.0), (8, 1.0, 0.0)}
        assert all(not r["new_sites"] for r in data["rows"]) and data["problems"] == []
        for key, run in data["runs"].items():
            f = engine_facts.in_force(run)
            assert run["rc"] == 0 and run["sglang_version"] == "0.5.9"
            assert (f["attn_backend"], f["piecewise"], f["hot_token_id_shape"]) == (
                "FlashAttentionBackend",
                "off",
                "[32000]",
            )
            patched = key.endswith("patched")
            assert (f["draft_extend_graph_runner"] != "None") is patched
    for run in _results("p9/rounds")["runs"].values():
        assert run["kernel_gaps"]["called"] == [] and "awq_marlin_moe_repack" in run["kernel_gaps"]["asked"]
    for row in _results("p9/run3")["rows"]:
        before, after = (f"{v:.1f}" for v in row["tok_per_s"])
        assert f"{before} → {after}" in section
    speed = (RUNS / "p9" / "rounds" / "speed.md").read_text()
    for cells in ("256.4 → 307.9 | 0.980, 1.432", "1992.4 → 2312.5 | 1.090, 1.223"):
        assert cells in speed and cells in section


def test_0_5_9_first_runs_stopped_where_the_docs_say():
    run1 = (RUNS / "p9" / "run1" / "engine.log").read_text()
    assert run1.count("cannot import name 'awq_marlin_moe_repack' from 'sgl_kernel'") >= 2
    run2 = (RUNS / "p9" / "run2" / "engine.log").read_text()
    assert "KV Cache is allocated" in run2 and "awq_marlin_moe_repack" not in run2
    assert run2.count("'_OpNamespace' 'sgl_kernel' object has no attribute 'fwd'") >= 2
    assert {r["rc"] for r in _results("p9/run2")["runs"].values()} == {-9}


# ---------------------------------------------------------------- every step: device, commit, digests


@pytest.mark.parametrize(
    "step", ["ab12-8b", "t13-fa3", "t13-tree", "t13-memcheck", "p9/run1", "p9/run2", "p9/run3", "p9/rounds"]
)
def test_docs_name_device_commit_and_each_tree(step):
    data, section = _results(step), _section()
    assert data["device"].startswith("NVIDIA H100") and data["patchkit_commit"][:7] in section
    for tree in data["trees"].values():
        assert f"`{tree_digest(tree['patched_files_sha256'])}`" in section
        for files in tree.get("variant_files_sha256", {}).values():
            assert f"`{tree_digest(files)}`" in section
