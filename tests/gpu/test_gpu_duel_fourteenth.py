"""docs/gpu.md's fourteenth run (issues 67 and 71, 2026-11-29e): Triton 8B eager bs 64 in two
duels beside its control, the STANDALONE duel that runs triton-draft-extend-prefix, FlashInfer
small. Its tables recomputed from the committed JSON (docs/results/gpu-duel-2026-11-29e), and
the figures its text cites read back."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import duel_runs

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-29e"
DOC = (ROOT / "docs" / "gpu.md").read_text()
SECTION = DOC.split("### Fourteenth run")[1].split("\n### ")[0]
COMMIT = "b5be8d9e006bd2f9d36843cc8b5387e30359aada"
DUELS = ("triton_8b_duel-r1", "triton_8b_duel-r2", "triton_sa_duel-r1", "flashinfer_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def test_every_duel_is_of_its_commit_on_shared_cores_and_rotated():
    for name in DUELS:
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)
        assert result["args"]["cpus"] == [4, 5, 6, 7] and result["args"]["rotate"]
    assert _run("triton_sa_duel-r1")["args"]["scenario"] == "standalone"
    assert {_run(n)["args"]["scenario"] for n in DUELS if n != "triton_sa_duel-r1"} == {"eagle3"}
    args = json.loads((RUN / "plan-args.json").read_text())
    steps = [args["env"]["STEPS"], *(a["env"]["STEPS"] for a in args["also"])]
    assert args["kind"] == "nvidia-h200" and steps == [
        "flashinfer_duel-r1",
        "triton_sa_duel-r1",
        "triton_8b_duel-r1",
        "triton_8b_duel-r1",  # run again under another R: committed as triton_8b_duel-r2
    ]


def test_the_verdict_table_is_the_runs():
    duel_runs.assert_verdict_rows(RUN, DUELS, SECTION)


def test_the_standalone_duel_accepts_alike_in_every_engine():
    """The accept length table: one value per engine and batch size, the same in all three trees."""
    accepts: dict[tuple[int, str], set[float]] = {}
    for call in _run("triton_sa_duel-r1")["calls"]:
        accepts.setdefault((call["batch_size"], call["engine"]), set()).add(call["accept_length"])
    for bs, value in ((8, 3.556), (32, 3.872), (64, 3.872)):
        graph = "eager" if bs > 32 else "captured"
        assert {round(a, 3) for e in ("pristine", "patched", "patched-again") for a in accepts[(bs, e)]} == {value}
        assert f"| {bs} | {graph} | {value:.3f} | {value:.3f} | {value:.3f} | 16 |" in SECTION


def test_the_bullets_figures():
    medians = {
        (name, r["pair"], r["batch_size"]): round(statistics.median(r["ratios"]), 3)
        for name in DUELS
        for r in _run(name)["summary"]
    }
    assert medians[("triton_8b_duel-r1", "pristine:patched", 64)] == 0.888
    assert medians[("triton_8b_duel-r2", "pristine:patched", 64)] == 1.001
    assert medians[("flashinfer_duel-r1", "patched:patched-hostplan", 8)] == 0.744
    assert "read\n  0.888 (18 rounds, the control 0.996) and 1.001 (47 rounds, the control 1.048)" in SECTION
    sa = [medians[("triton_sa_duel-r1", "pristine:patched", bs)] for bs in (8, 32, 64)]
    control = [medians[("triton_sa_duel-r1", "patched:patched-again", bs)] for bs in (8, 32, 64)]
    assert (
        "speed {:.3f} / {:.3f}\n  / {:.3f} against a control of {:.3f} / {:.3f} / {:.3f}".format(*sa, *control)
        in SECTION
    )


def test_the_duels_report_prints_each_engines_accept_length():
    """duel.md (duel_report.markdown) gives the accept length per engine, so a poll reads it."""
    from gpu_e2e import duel_report

    md = duel_report.markdown(_run("triton_sa_duel-r1"))
    for engine in ("pristine", "patched", "patched-again"):
        assert f"| 8 | {engine} | 16 | 3.556 | 3.556 | 3.556 |" in md
    older = duel_runs.load(RUN.parent / "gpu-duel-2026-11-29d", "triton_duel-r1")  # packed without them
    assert "accept length a call" in md and "accept length a call" not in duel_report.markdown(older)
