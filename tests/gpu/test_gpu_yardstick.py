"""Issue 57's yardstick: patched 0.5.12.post1 against upstream 0.5.17 on one GPU
(docs/results/gpu-yardstick-2026-11-27/, docs/gpu.md "0.5.17 yardstick"). The reader
(gpu_e2e/yardstick.py) is checked on synthetic calls, and every committed figure is
recomputed from the committed JSON. No GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_e2e import tables, yardstick
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUN = repo_root() / "docs" / "results" / "gpu-yardstick-2026-11-27"
GPU_MD = repo_root() / "docs" / "gpu.md"


def _batch(bs: int, tok_per_s: float, syncs: dict, ids=None) -> dict:
    return {
        "batch_size": bs,
        "workload": "uniform",
        "tok_per_s": tok_per_s,
        "decode_steps": 100,
        "accept_length": 1.0,
        "syncs": syncs,
        "output_ids": ids or [[1, 2, 3]] * bs,
        "sync_debug_armed": True,
    }


def _call(folder: Path, name: str, variant: str, batches: list[dict], graph_max: int = 32) -> None:
    release = "0.5.17" if name.endswith("b17") else "0.5.12.post1"
    key = "cuda_graph_max_bs_decode" if release == "0.5.17" else "cuda_graph_max_bs"
    runs = {f"{release}/small/x/r/{variant}": {"batches": batches, "engine_kwargs": {key: graph_max}}}
    (folder / name).mkdir(parents=True)
    (folder / name / "results.json").write_text(json.dumps({"runs": runs}))


def test_a_round_pairs_two_calls_and_only_one_machine_counts(tmp_path):
    blocking = {"sync|sglang/srt/a.py:f:1": 200}  # 2 host waits per step
    for rnd, (p, u) in {"r1": (200.0, 100.0), "r2": (300.0, 100.0), "r3": (90.0, 100.0)}.items():
        _call(tmp_path, f"fa3-{rnd}-b12", "patched", [_batch(8, p, {}), _batch(48, p, {})])
        _call(tmp_path, f"fa3-{rnd}-b17", "upstream", [_batch(8, u, blocking), _batch(48, u, blocking, [[9]] * 48)])
    (tmp_path / "machines.json").write_text(
        json.dumps(
            {"fa3-r1-b12": 1, "fa3-r1-b17": 2, "fa3-r2-b12": 2, "fa3-r2-b17": 2, "fa3-r3-b12": 2, "fa3-r3-b17": 2}
        )
    )
    rows = yardstick.rows(tmp_path)
    assert [(r["round"], r["batch_size"], r["same_machine"]) for r in rows] == [
        ("r1", 8, False),
        ("r1", 48, False),
        ("r2", 8, True),
        ("r2", 48, True),
        ("r3", 8, True),
        ("r3", 48, True),
    ]
    assert rows[0]["waits_per_step"] == (0.0, 2.0) and rows[0]["sites"]["upstream"] == {"sglang/srt/a.py:f": 2.0}
    assert [r["eager"] for r in rows[:2]] == [False, True]
    assert rows[1]["identical_requests"] == (0, 48) and rows[0]["identical_requests"] == (8, 8)
    s8 = yardstick.summary(rows)[0]
    assert (s8["batch_size"], s8["rounds"], s8["median_ratio"], s8["range"]) == (8, ["r2", "r3"], 1.95, (0.9, 3.0))
    assert s8["other_machine"] == [("r1", 2.0)]


def test_a_round_with_one_side_missing_gives_no_row_and_no_machines_file_no_median(tmp_path):
    _call(tmp_path, "triton-r1-b12", "patched", [_batch(1, 10.0, {})])
    _call(tmp_path, "triton-r1-b17", "upstream", [_batch(1, 5.0, {})])
    _call(tmp_path, "triton-r2-b12", "patched", [_batch(1, 10.0, {})])
    rows = yardstick.rows(tmp_path)
    assert [(r["round"], r["ratio"], r["same_machine"]) for r in rows] == [("r1", 2.0, False)]
    assert yardstick.summary(rows)[0]["median_ratio"] is None


def test_the_command_line_refuses_a_missing_folder(tmp_path, capsys):
    assert yardstick.main([str(tmp_path / "nope")]) == 2
    assert "usage" in capsys.readouterr().err


# --- the committed run -------------------------------------------------------------


def test_the_committed_tables_are_recomputed_from_the_json():
    text = yardstick.report(RUN)
    summary = text.split("\n\n")[0]
    assert summary in GPU_MD.read_text(), "docs/gpu.md's yardstick table is not the one the JSON gives"
    profiles = text.split("\n\n")[2]
    assert profiles in GPU_MD.read_text(), "docs/gpu.md's profile table is not the one the JSON gives"


def test_patched_waits_no_more_than_0_5_17_by_torch_and_outputs_are_identical():
    rows = yardstick.rows(RUN)
    assert len(rows) == 49
    counted = [r for r in rows if r["waits_per_step"][0] is not None]
    assert len(counted) == 26 and all("off" not in r["backend"] for r in counted)
    for r in counted:
        patched, upstream = r["waits_per_step"]
        assert patched <= upstream, r  # done-when 2, by torch's count
        assert round(patched, 2) == 0.03 and round(upstream, 2) == 2.03
        assert set(r["sites"]["upstream"]) >= {"sglang/srt/speculative/eagle_utils.py:eagle_prepare_for_decode"}
        # ...but not by the wrapper's event waits: verify_done twice a step (#25879 not carried)
        assert tuple(round(x, 2) for x in r["event_waits_per_step"]) == (3.0, 1.0)
    for r in rows:
        assert r["identical_requests"][0] == r["identical_requests"][1] == r["batch_size"]


def test_the_8b_gap_is_the_one_gpu_md_states():
    """8B: patched below 0.5.17 on both backends, counters on and off; small: at or above."""
    by = {(s["backend"], s["batch_size"]): s for s in yardstick.summary(yardstick.rows(RUN))}
    for backend in ("fa3_8b", "fa3_8boff", "triton_8b", "triton_8boff"):
        assert all(0.85 < by[(backend, bs)]["median_ratio"] < 0.97 for bs in (1, 8, 32)), backend
    for backend in ("fa3_off", "triton_off"):
        assert all(by[(backend, bs)]["median_ratio"] > 1.0 for bs in (1, 8, 32)), backend
    assert by[("fa3_8boff", 1)]["rounds"] == ["r1", "r2"]


def test_the_profiles_put_the_8b_gap_in_host_gaps_not_kernels():
    from gpu_e2e import profile_table

    rows = {(r["call"], r["variant"]): r for r in profile_table.rows(RUN, yardstick.label)}
    patched, upstream = rows[("fa3_8boff-r1-b12", "patched")], rows[("fa3_8boff-r1-b17", "upstream")]
    assert abs(patched["kernels_ms"] / upstream["kernels_ms"] - 1) < 0.01
    assert (patched["gaps_ms"], upstream["gaps_ms"]) == (2.358, 1.149)
    assert (patched["copies"], upstream["copies"]) == (33.2, 15.2)
    assert upstream["graphs"] is None  # not among the calls the summary kept: shown "–", not 0


def test_a_label_reads_the_plan_step_name():
    assert [yardstick.label(b) for b in ("fa3", "fa3_off", "triton_8b", "triton_8boff")] == [
        "FA3, small",
        "FA3, small, counters off",
        "Triton, 8B",
        "Triton, 8B, counters off",
    ]


def test_a_counters_off_round_has_no_waits_and_keeps_its_ratio(tmp_path):
    _call(tmp_path, "fa3_off-r1-b12", "patched", [dict(_batch(8, 200.0, {}), decode_steps=0)])
    _call(tmp_path, "fa3_off-r1-b17", "upstream", [dict(_batch(8, 100.0, {}), decode_steps=0)])
    (row,) = yardstick.rows(tmp_path)
    assert row["ratio"] == 2.0 and row["event_waits_per_step"] == (None, None)
    (s,) = yardstick.summary([row])
    assert s["waits_per_step"] == (None, None) and s["median_ratio"] is None  # no machines file


def test_the_fa3_round_across_two_machines_is_out_of_the_median():
    by = {(s["backend"], s["batch_size"]): s for s in yardstick.summary(yardstick.rows(RUN))}
    assert by[("fa3", 8)]["rounds"] == ["r2", "r3"] and [r for r, _ in by[("fa3", 8)]["other_machine"]] == ["r1"]
    assert by[("fa3", 48)]["median_ratio"] is None
    assert by[("triton", 48)]["rounds"] == ["r1"]


@pytest.mark.parametrize(
    "step,commit",
    [
        ("fa3-r1-b12", "18a5b08"),
        ("fa3-r2-b12", "18a5b08"),
        ("triton-r1-b12", "18a5b08"),
        ("fa3-r3-b12", "821b890"),
        ("fa3_8boff-r1-b12", "821b890"),
        ("triton_8b-r1-b12", "821b890"),
        ("triton_off-r2-b12", "821b890"),
    ],
)
def test_the_patched_tree_is_the_one_gpu_md_names(step, commit):
    data = json.loads((RUN / step / "results.json").read_text())
    files = data["trees"]["0.5.12.post1"]["patched_files_sha256"]
    assert tree_digest(files) == "132d33dfb0036dbf"
    assert data["patchkit_commit"].startswith(commit) and data["device"].startswith("NVIDIA H200")
    assert "132d33dfb0036dbf" in GPU_MD.read_text()


@pytest.mark.parametrize("step,backend", [("fa3-r1-b12", "FA3 (picked by the release)"), ("triton-r1-b12", "Triton")])
def test_issue_53_third_lease_rows_are_the_json(step, backend):
    """Pristine → patched host waits per decode step, and the step's table.md, from its JSON."""
    from gpu_e2e import orchestrate, report

    data = json.loads((RUN / step / "results.json").read_text())
    runs = data["runs"]
    rows = report.compare(
        "0.5.12.post1",
        runs["0.5.12.post1/small/" + ("default" if step.startswith("fa3") else "triton") + "/r1/pristine"],
        runs["0.5.12.post1/small/" + ("default" if step.startswith("fa3") else "triton") + "/r1/patched"],
    )
    assert orchestrate.tables(rows) == tables.text(RUN / step, "table.md")
    cells = [f"{a:.2f} → {b:.2f}" for a, b in (r["waits"]["per_step"] for r in rows)]
    assert [r["batch_size"] for r in rows] == [1, 8, 32, 48] and all(r["identical"] for r in rows)
    assert f"| {backend} | {' | '.join(cells)} | identical |" in GPU_MD.read_text()


def test_decode_alone_is_read_where_both_sides_timed_the_first_token(tmp_path):
    """The whole-generate ratio holds the prefill; the decode-only ratio does not."""
    for rnd in ("r1", "r2"):
        p = {**_batch(8, 95.0, {}), "first_token_median_s": 0.06, "decode_tok_per_s": 101.0}
        u = {**_batch(8, 100.0, {}), "first_token_median_s": 0.03, "decode_tok_per_s": 100.0}
        _call(tmp_path, f"fa3_8boff-{rnd}-b12", "patched", [p])
        _call(tmp_path, f"fa3_8boff-{rnd}-b17", "upstream", [u])
    (tmp_path / "machines.json").write_text(json.dumps({f"fa3_8boff-{r}-b1{s}": 1 for r in ("r1", "r2") for s in "27"}))
    table = yardstick.rows(tmp_path)
    assert [yardstick.decode_ratio(r) for r in table] == [pytest.approx(1.01)] * 2
    md = yardstick.decode_markdown(table)
    assert "| FA3, 8B, counters off | r1 | 8 | 60.0 / 30.0 | 101 / 100 | 1.010 | 0.950 |" in md
    assert "| FA3, 8B, counters off | 8 | 2 | 1.010 | 0.950 |" in md
    assert md in yardstick.report(tmp_path)


def test_calls_before_the_first_token_was_timed_have_no_decode_table():
    assert yardstick.decode_markdown(yardstick.rows(RUN)) == ""
