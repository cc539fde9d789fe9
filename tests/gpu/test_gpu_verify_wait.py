"""Issue 57's fifth lease and the sixth's first machine: verify-wait-on-stream's A/B at the 8B
shape on one H200 each (docs/results/gpu-verify-wait-2026-11-27/, docs/gpu.md "At a glance"). The ``--minus``
reader (gpu_e2e/yardstick.py's minus_rows) is checked on synthetic calls, and every committed figure
is recomputed from the committed JSON. No GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_e2e import profile_table, yardstick
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUN = repo_root() / "docs" / "results" / "gpu-verify-wait-2026-11-27"
GPU_MD = repo_root() / "docs" / "gpu.md"
PATCH = "verify-wait-on-stream"


def test_the_committed_tables_are_recomputed_from_the_json():
    text = yardstick.report(RUN)
    summary, _rounds, profiles, _ab, medians = text.rstrip("\n").split("\n\n")
    for table in (summary, profiles, medians):
        assert table in GPU_MD.read_text(), "docs/gpu.md's tables are not the ones the JSON gives"


def test_the_patch_closes_the_event_waits_and_keeps_outputs_identical():
    rows = yardstick.minus_rows(RUN)
    assert len(rows) == 21 and {r["patch"] for r in rows} == {PATCH}  # 7 calls of 3 batch sizes
    for r in rows:
        assert r["identical_requests"][0] == r["identical_requests"][1] == r["batch_size"]
        assert r["ratio"] > 1.02, r  # faster with the patch, every round and batch size
    counted = [r for r in rows if r["event_waits_per_step"][0] is not None]
    assert len(counted) == 3
    for r in counted:  # verify_done twice a step (filter_batch, prepare_for_decode) is gone
        assert tuple(round(x, 2) for x in r["event_waits_per_step"]) == (3.0, 1.0)


def test_patched_against_0_5_17_at_8b_is_what_gpu_md_says():
    by = {(s["backend"], s["batch_size"]): s for s in yardstick.summary(yardstick.rows(RUN))}
    medians = {key: round(s["median_ratio"], 4) for key, s in by.items()}
    assert min(medians.values()) == 0.9783 == medians[("triton_8boff", 8)]  # the one cell under 0.98
    assert sum(m >= 0.98 for m in medians.values()) == 8 and max(medians.values()) < 1.0
    assert all(len(s["ratios"]) == 3 for (backend, _), s in by.items() if backend.endswith("off"))
    for r in yardstick.rows(RUN):
        assert r["same_machine"] and r["identical_requests"][0] == r["batch_size"]
        if r["event_waits_per_step"][0] is not None:  # done-when 2, both counts, site by site
            assert tuple(round(x, 2) for x in r["event_waits_per_step"]) == (1.0, 1.0)
            assert round(r["waits_per_step"][0], 2) == 0.03 and round(r["waits_per_step"][1], 2) == 2.03


def test_the_profiles_show_the_gaps_closed_not_the_kernels_changed():
    rows = {(r["call"], r["variant"]): r for r in profile_table.rows(RUN, yardstick.label)}
    without, with_ = rows[("fa3_8boff-r1-b12", f"minus-{PATCH}")], rows[("fa3_8boff-r1-b12", "patched")]
    assert (without["gaps_ms"], with_["gaps_ms"], rows[("fa3_8boff-r1-b17", "upstream")]["gaps_ms"]) == (
        2.505,
        0.826,
        1.047,
    )
    assert abs(with_["kernels_ms"] / without["kernels_ms"] - 1) < 0.01


def test_every_b12_call_ran_the_tree_gpu_md_names():
    for path in sorted(RUN.glob("*-b12/results.json")):
        data = json.loads(path.read_text())
        tree = data["trees"]["0.5.12.post1"]
        digests = {"patched": tree["patched_files_sha256"], **tree["variant_files_sha256"]}
        got = {name: tree_digest(files) for name, files in digests.items()}
        assert got == {"patched": "f9d514b5bccb3c29", f"minus-{PATCH}": "ce6a1d3adfd1228d"}, path
        # the same trees, bundled twice: a9e972f (fifth lease), f033669 (sixth lease, machine 6)
        assert data["patchkit_commit"][:7] in ("a9e972f", "f033669") and data["device"].startswith("NVIDIA H200")
    text = GPU_MD.read_text()
    assert "f9d514b5bccb3c29" in text and "ce6a1d3adfd1228d" in text


def _call(folder: Path, name: str, runs: dict) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "results.json").write_text(json.dumps({"runs": runs}))


def _batch(bs: int, tok_per_s: float, waits: int = 0) -> dict:
    return {
        "batch_size": bs,
        "workload": "uniform",
        "tok_per_s": tok_per_s,
        "decode_steps": 10,
        "syncs": {"wait|x.py:f:1": waits} if waits else {},
        "output_ids": [[1, 2]] * bs,
    }


def test_a_call_without_a_minus_tree_gives_no_row_and_no_table(tmp_path):
    _call(tmp_path, "fa3-r1-b12", {"0.5.12.post1/small/x/r1/patched": {"batches": [_batch(8, 100.0)]}})
    assert yardstick.minus_rows(tmp_path) == [] and yardstick.minus_markdown([]) == ""
    _call(
        tmp_path,
        "fa3-r2-b12",
        {
            "0.5.12.post1/small/x/r2/minus-x": {"batches": [_batch(8, 80.0, waits=30)]},
            "0.5.12.post1/small/x/r2/patched": {"batches": [_batch(8, 100.0, waits=10)]},
        },
    )
    (row,) = yardstick.minus_rows(tmp_path)
    assert (row["round"], row["patch"], row["ratio"], row["event_waits_per_step"]) == ("r2", "x", 1.25, (3.0, 1.0))
    assert "| FA3, small | r2 | 8 | 80 → 100 | 1.250 | 3.00 → 1.00 | 8 of 8 requests |" in yardstick.minus_markdown(
        [row]
    )


def test_a_minus_call_that_timed_the_first_token_shows_the_decode_alone_beside(tmp_path):
    without, with_ = _batch(8, 80.0), _batch(8, 100.0)
    without["decode_tok_per_s"], with_["decode_tok_per_s"] = 90.0, 99.0
    _call(
        tmp_path,
        "fa3-r1-b12",
        {"0.5.12.post1/8b/x/r1/minus-x": {"batches": [without]}, "0.5.12.post1/8b/x/r1/patched": {"batches": [with_]}},
    )
    (row,) = yardstick.minus_rows(tmp_path)
    assert row["decode_tok_per_s"] == (90.0, 99.0)
    text = yardstick.minus_markdown([row])
    assert "| FA3, small | r1 | 8 | 80 → 100 | 1.250 | 1.100 | 0.00 → 0.00 | 8 of 8 requests |" in text
    assert "| FA3, small | 8 | 1 | 1.250 | 1.100 |" in text
