"""docs/gpu.md's sixteenth run (issues 67 and 71, 2026-11-30): DeepSeek TP 2 + DP attention 2 beside
0.5.17 over 15 rounds, FlashInfer 8B with its host-plan switch, FlashInfer small profiled at captured
bs 1 with the switches off and on, and both switches at 8B. Its tables recomputed from the
committed JSON (docs/results/gpu-duel-2026-11-30), and the figures its text cites read back."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import duel_runs

from gpu_e2e.report import tree_digest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-30"
DOC = (ROOT / "docs" / "gpu.md").read_text()
SECTION = DOC.split("### Sixteenth run")[1].split("\n### ")[0]
TEXT = " ".join(SECTION.split())
COMMIT = "6f47a0fc0db028b7635ccb27325701b2472bf67b"
DUELS = ("ds_dp2_duel-r1", "flashinfer_8b_duel-r1", "flashinfer_8b_graph_duel-r1")
SWITCHES = {"PATCHKIT_FLASHINFER_HOST_INDPTR": "1", "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH": "1"}


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def _medians(name: str, pair: str, sizes: tuple[int, ...]) -> list[float]:
    rows = {r["batch_size"]: r for r in _run(name)["summary"] if r["pair"] == pair}
    return [round(statistics.median(rows[bs]["ratios"]), 3) for bs in sizes]


def test_every_duel_is_of_its_commit_on_its_lane():
    for name in DUELS:
        duel_runs.assert_clean(_run(name), COMMIT)
        assert _run(name)["args"]["rotate"]
    ds = _run("ds_dp2_duel-r1")["args"]
    assert (ds["tp"], ds["dp"], ds["scenario"]) == (2, 2, "mtp")
    assert _run("flashinfer_8b_duel-r1")["args"]["cpus"] == list(range(8, 16))
    assert _run("flashinfer_8b_graph_duel-r1")["args"]["cpus"] == list(range(16, 24))
    args = json.loads((RUN / "plan-args.json").read_text())
    assert args["kind"] == args["second"]["kind"] == "nvidia-h200-x2"
    assert [args["env"]["STEPS"], *(a["env"]["STEPS"] for a in args["also"])] == [
        "",
        "flashinfer_8b_duel-r1",
        "flashinfer_prof-r1 flashinfer_prof-r3",
    ]
    assert args["second"]["env"]["FI_GRAPH"] == "only"


def test_both_switches_reached_the_graph_engines_schedulers():
    graph = _run("flashinfer_8b_graph_duel-r1")["engines"]["patched-graph"]
    assert graph["env"] == SWITCHES and graph["env_ok"]
    assert graph["env_seen"] and all(
        {k: seen.get(k) for k in SWITCHES} == SWITCHES for seen in graph["env_seen"].values()
    )


def test_every_patched_engine_ran_the_tree_cited():
    trees = [files for name in DUELS for files in _run(name)["patched_files_sha256"].values() if files]
    assert len(trees) == 4 and all(t == trees[0] for t in trees) and len(trees[0]) == 43
    assert f"digest `{tree_digest(trees[0])}`" in SECTION


def test_the_verdict_table_is_the_runs():
    duel_runs.assert_verdict_rows(RUN, DUELS, SECTION)


def test_the_profile_table_is_the_compare_json():
    cells = json.loads((RUN / "flashinfer_prof-compare.json").read_text())["cells"]
    for rnd, label in (("r1", "switches off"), ("r3", "both switches on")):
        cmp = cells[f"0.5.12.post1_small_flashinfer_{rnd}/uniform/bs1"]["compare"]
        syncs = [s["calls"] for s in cmp["runtime"]["cudaStreamSynchronize"]]
        extend = {p["name"]: p["us"] for p in cmp["phases"]}["host step[DRAFT_EXTEND_V2 bs=1]"]
        shown = f"{extend[0]:.1f} → " + ("captured" if extend[1] == 0 else f"{extend[1]:.1f}")
        table = (RUN / f"flashinfer_prof-{rnd}-table.md").read_text()
        rates = table.split("| none | none | ")[1].split(" |")[0]
        line = (
            f"| {rnd}: pristine → patched, {label} | {cmp['wall_us'][0]:.1f} → {cmp['wall_us'][1]:.1f} "
            f"| {cmp['kernel_union_us'][0]:.1f} → {cmp['kernel_union_us'][1]:.1f} "
            f"| {cmp['gaps_us'][0]:.1f} → {cmp['gaps_us'][1]:.1f} | {syncs[0]:.1f} → {syncs[1]:.1f} "
            f"| {shown} | {rates} |"
        )
        assert line in SECTION, line
    on = cells["0.5.12.post1_small_flashinfer_r3/uniform/bs1"]["compare"]
    assert f"patched's step {-on['wall_us'][2]:.0f} us shorter" in TEXT
    ops = {o["name"]: o["calls"] for o in on["cpu_ops"]}
    assert ops["aten::repeat_interleave"] == [1.0, 3.0] and ops["aten::arange"] == [6.0, 16.0]
    assert ops["aten::where"] == [0, 2.0]


def test_the_bullets_figures():
    ds = [_medians("ds_dp2_duel-r1", p, (48, 128)) for p in ("pristine:patched", "upstream:patched")]
    assert f"Eager bs 48 reads {ds[0][0]:.3f}x pristine and {ds[1][0]:.3f}x 0.5.17" in TEXT
    assert f"eager bs 128 {ds[0][1]:.3f}x and {ds[1][1]:.3f}x" in TEXT
    off = _medians("flashinfer_8b_duel-r1", "pristine:patched", (1, 8, 32, 64, 128))
    assert "{:.3f} / {:.3f} / {:.3f} captured and {:.3f} / {:.3f} eager against pristine".format(*off) in TEXT
    switch = _medians("flashinfer_8b_duel-r1", "patched:patched-hostplan", (1, 8, 32, 64, 128))
    assert "{:.3f} / {:.3f} / {:.3f} against the switch off at the captured sizes".format(*switch[:3]) in TEXT
    assert "{:.3f} / {:.3f} eager".format(*switch[3:]) in TEXT
    both = _medians("flashinfer_8b_graph_duel-r1", "pristine:patched-graph", (1, 8, 32, 64, 128))
    up = _medians("flashinfer_8b_graph_duel-r1", "upstream:patched-graph", (1, 8, 32, 64, 128))
    assert "{:.3f} / {:.3f} / {:.3f}x pristine captured".format(*both[:3]) in TEXT
    assert "{:.3f} / {:.3f} / {:.3f}x 0.5.17; eager {:.3f} / {:.3f}x pristine".format(*up[:3], *both[3:]) in TEXT
