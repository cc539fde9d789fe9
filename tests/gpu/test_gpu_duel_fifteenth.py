"""docs/gpu.md's fifteenth run (issues 67 and 71, 2026-11-29f): FlashInfer small with two engines
of each tree, FlashInfer 8B, the STANDALONE duel on a random-weight target, the bound's debug
check, DeepSeek TP 2 + DP attention 2 beside 0.5.17. Its tables recomputed from the committed JSON
(docs/results/gpu-duel-2026-11-29f), and the figures its text cites read back."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import duel_runs

from gpu_e2e import duel_stats
from gpu_e2e.report import tree_digest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-29f"
DOC = (ROOT / "docs" / "gpu.md").read_text()
SECTION = DOC.split("### Fifteenth run")[1].split("\n### ")[0]
COMMIT = "02f0ca95f53b6cd5488da5b88a063194b1fb01f4"
CLEAN = ("flashinfer_duel-r1", "flashinfer_8b_duel-r1", "ds_dp2_duel-r1")
DUELS = (*CLEAN, "triton_sa_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def _median(name: str, pair: str, bs: int) -> float:
    (row,) = (r for r in _run(name)["summary"] if r["pair"] == pair and r["batch_size"] == bs)
    return round(statistics.median(row["ratios"]), 3)


def test_every_duel_is_of_its_commit_and_each_lane_on_its_own_cores():
    for name in CLEAN:
        duel_runs.assert_clean(_run(name), COMMIT)
    duel_runs.assert_recomputes(_run("triton_sa_duel-r1"), COMMIT)
    assert _run("flashinfer_duel-r1")["args"]["cpus"] == list(range(8, 16))
    assert _run("triton_sa_duel-r1")["args"]["cpus"] == list(range(8, 16))
    assert _run("flashinfer_8b_duel-r1")["args"]["cpus"] == list(range(16, 24))
    ds = _run("ds_dp2_duel-r1")["args"]
    assert (ds["tp"], ds["dp"], ds["scenario"]) == (2, 2, "mtp") and all(_run(n)["args"]["rotate"] for n in DUELS)
    args = json.loads((RUN / "plan-args.json").read_text())
    steps = [args["env"]["STEPS"], *(a["env"]["STEPS"] for a in args["also"])]
    assert args["kind"] == "nvidia-h200-x2"
    assert steps == ["flashinfer_duel-r1", "triton_sa_duel-r1", "flashinfer_8b_duel-r1", "triton_check-r1", ""]


def test_every_patched_engine_ran_the_tree_cited():
    trees = [files for name in DUELS for files in _run(name)["patched_files_sha256"].values() if files]
    assert len(trees) == 8 and all(t == trees[0] for t in trees) and len(trees[0]) == 43
    assert f"digest `{tree_digest(trees[0])}`" in SECTION
    for path in ("flashinfer_backend.py", "triton_backend.py"):
        digest = trees[0][f"srt/layers/attention/{path}"][:16]
        assert f"`{path}` {digest}…" in " ".join(SECTION.split())


def test_the_verdict_table_is_the_runs():
    duel_runs.assert_verdict_rows(RUN, DUELS, SECTION)


def test_the_random_weight_target_changes_outputs_only_where_the_draft_changed():
    """STANDALONE on a random target: pristine and patched differ at the captured sizes (where the
    patch changes the draft's replay), agree eager; the patched twins agree everywhere."""
    sa = _run("triton_sa_duel-r1")
    assert sa["engines"]["patched"]["ready"]["target_weights"]["seed"] == 20261126
    same = {(r["batch_size"], r["pair"]): r["identical"] for r in sa["summary"]}
    assert same == {
        (8, "pristine:patched"): False,
        (32, "pristine:patched"): False,
        (64, "pristine:patched"): True,
        (8, "patched:patched-again"): True,
        (32, "patched:patched-again"): True,
        (64, "patched:patched-again"): True,
    }
    accepts = {(a["batch_size"], a["engine"]): a for a in duel_stats.accepts(sa["calls"])}
    for bs, graph in ((8, "captured"), (32, "captured"), (64, "eager")):
        p, q, r = (accepts[(bs, e)] for e in ("pristine", "patched", "patched-again"))
        assert all(a["min"] == a["max"] and a["calls"] == 4 for a in (p, q, r)) and q["median"] == r["median"]
        assert f"| {bs} | {graph} | {p['median']:.3f} | {q['median']:.3f} | {r['median']:.3f} | 4 |" in SECTION


def test_the_bound_check_ran_at_every_batch_size_and_never_fired():
    result = json.loads((RUN / "triton_check-r1-b12" / "results.json").read_text())
    assert result["args"]["engine_env"] == ["PATCHKIT_CHECK_SEQ_LEN_BOUND=1"]
    assert result["args"]["batch_sizes"] == "1,8,32,64,128" and not result["problems"]
    assert result["patchkit_commit"] == COMMIT
    (run,) = result["runs"].values()
    assert (
        run["rc"] == 0
        and run["engine_env_seen"]
        and all(seen.get("PATCHKIT_CHECK_SEQ_LEN_BOUND") == "1" for seen in run["engine_env_seen"].values())
    )


def test_the_bullets_figures():
    fi = _run("flashinfer_duel-r1")
    pooled = {
        bs: round(
            statistics.median(
                x
                for r in fi["summary"]
                if r["batch_size"] == bs and r["pair"] in ("pristine:patched", "pristine-again:patched-again")
                for x in r["ratios"]
            ),
            3,
        )
        for bs in (1, 8, 32, 64, 128)
    }
    assert "reads {:.3f} / {:.3f} / {:.3f} captured and {:.3f} / {:.3f} eager".format(*pooled.values()) in SECTION
    twins = [
        _median("flashinfer_duel-r1", p, bs)
        for p in ("pristine:pristine-again", "patched:patched-again")
        for bs in (1, 8, 32, 64, 128)
    ]
    assert f"from {min(twins):.3f} to {max(twins):.3f}" in SECTION
    switch = [_median("flashinfer_duel-r1", "patched:patched-hostplan", bs) for bs in (1, 8, 32, 64, 128)]
    assert "the switch off: {:.3f} / {:.3f} / {:.3f} captured, {:.3f} / {:.3f} eager".format(*switch) in SECTION
    big = [_median("flashinfer_8b_duel-r1", "patched:patched-hostplan", bs) for bs in (1, 8, 32)]
    assert "{:.3f} / {:.3f} / {:.3f} at the captured sizes".format(*big) in SECTION
    ds = [_median("ds_dp2_duel-r1", p, 48) for p in ("pristine:patched", "upstream:patched")]
    assert "eager bs 48 reads {:.3f}x pristine and {:.3f}x 0.5.17".format(*ds) in SECTION
