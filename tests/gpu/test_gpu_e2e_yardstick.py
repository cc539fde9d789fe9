"""Issue 57's first GPU rounds (docs/results/gpu-yardstick-2026-11-27), read again on CPU:
a call with one variant has no pair and is OK where its engines ran; 0.5.17's graph setup
(target and draft prefill graphs, ``breakable``; draft decode, ``full``) is read back from
its own log lines and runners, while 0.5.10–0.5.13's reading stays as it was."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as ns

import pytest

from gpu_e2e import call_verdict, engine_facts

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "gpu-yardstick-2026-11-27"


def _results(step: str) -> dict:
    return json.loads((RESULTS / step / "results.json").read_text())


# ------------------------------------------------------------------ the verdict


@pytest.mark.parametrize("step,variant", [("fa3-r2-b17", "upstream"), ("fa3-r2-b12", "patched")])
def test_a_call_with_one_variant_that_ran_is_ok_with_a_note(step, variant):
    results = _results(step)
    assert not results["rows"] and not results["problems"]  # what read NOT OK
    assert call_verdict.verdict(results)
    assert results["notes"] == [
        f"one variant ({variant}): no pair to compare in this call; its comparison is made across calls"
    ]


def test_a_call_whose_engine_failed_stays_not_ok():
    results = _results("fa3-r1-b17-no-deep-gemm")
    assert not call_verdict.verdict(results) and results["notes"] == []
    ran_no_batches = _results("fa3-r2-b17")  # rc 0 but nothing measured: no PROBLEM line, still NOT OK
    for run in ran_no_batches["runs"].values():
        run["batches"] = []
    assert not call_verdict.verdict(ran_no_batches)
    problem = _results("fa3-r2-b12")
    problem["problems"].append("a problem")
    assert not call_verdict.verdict(problem) and problem["notes"] == []


def test_a_pair_is_ok_by_its_rows_and_needs_them():
    pair = _results("fa3-r1-b12")
    notes = list(pair["notes"])
    assert call_verdict.verdict(pair) and pair["notes"] == notes  # no one-variant NOTE
    assert call_verdict.variants_run(pair) == ["patched", "pristine"]
    pair["rows"] = []
    assert not call_verdict.verdict(pair)  # two variants, nothing compared


# ------------------------------------------------------------------ 0.5.17's graphs


def _runs_with_log(step: str) -> dict[str, dict]:
    """Each run of a step, its ``engine_log`` read again from its section of engine.log."""
    text = (RESULTS / step / "engine.log").read_text()
    runs = _results(step)["runs"]
    for key, run in runs.items():
        start = text.index(f"===== {key} =====")
        end = text.find("\n===== ", start + 1)
        run["engine_log"] = engine_facts.log_facts(text[start : end if end > 0 else None])
    return runs


def test_017_graphs_are_read_from_its_capture_lines_and_timings():
    (fa3,) = _runs_with_log("fa3-r2-b17").values()
    assert fa3["engine_log"]["graph_captures"] == {
        "target prefill": "breakable",
        "target verify": "full",
        "draft prefill": "breakable",
        "draft decode": "full",
    }
    assert fa3["engine_log"]["graph_startup_s"] == {
        "prefill": 3.70,
        "decode": 0.0,
        "target_verify": 1.97,
        "draft_prefill": 1.73,
        "draft_decode": 4.72,
        "draft_extend": 0.0,
    }
    f = engine_facts.in_force(fa3)
    assert f["piecewise"] == "on (breakable)"
    # its schedulers noted 0.5.12's runner names, which 0.5.17 lacks: not known, rather than None
    assert (f["piecewise_runner"], f["draft_piecewise_runner"]) == ("?", "?")
    # FA3's draft extend runs eagerly on 0.5.17: its capture keeps to Triton, FlashInfer,
    # TRT-LLM and the MLA backends (eagle_worker_v2.py:407); none was captured, and none logged
    assert f["draft_extend_graph_runner"] == "None" and f["log_draft_extend_capture"] == 0
    assert f["graphs"] == (
        "target prefill breakable 3.70 s, target verify full 1.97 s, "
        "draft prefill breakable 1.73 s, draft decode full 4.72 s"
    )
    (triton,) = _runs_with_log("triton-r1-b17").values()
    t = engine_facts.in_force(triton)
    assert t["draft_extend_graph_runner"] == "EAGLEDraftExtendCudaGraphRunner"
    assert t["log_draft_extend_capture"] == 1  # "Capture draft extend CUDA graph begin", 0.5.17's case
    assert t["graphs"].endswith("draft extend full 1.67 s")
    md = engine_facts.settings_markdown({"k": fa3})
    assert "| k | on (breakable) | ? / ? | fa3 | FlashAttentionBackend | None | 0 / 0 |" in md


def test_012_reading_is_unchanged():
    runs = _runs_with_log("fa3-r1-b12")
    for key, run in runs.items():
        assert "graph_captures" not in run["engine_log"] and "graph_startup_s" not in run["engine_log"]
        f = engine_facts.in_force(run)
        assert (f["piecewise"], f["piecewise_runner"], f["draft_piecewise_runner"], f["graphs"]) == (
            "on",
            "PiecewiseCudaGraphRunner",
            "None",
            "–",
        )
        assert f["log_piecewise_capture"] == 1
        # the committed settings.md (written by the orchestrator then; its section of the run's file) reads the same, one column more
        committed = (RESULTS / "settings.md").read_text().split("\n## fa3-r1-b12\n")[1].split("\n## ")[0].splitlines()
        row = next(line for line in engine_facts.settings_markdown({key: run}).splitlines() if key in line)
        assert row.rsplit("|", 2)[0] + "|" in committed
    patched, pristine = runs["0.5.12.post1/small/default/r1/patched"], runs["0.5.12.post1/small/default/r1/pristine"]
    assert engine_facts.in_force(patched)["log_draft_extend_capture"] == 1
    assert engine_facts.in_force(pristine)["log_draft_extend_capture"] == 0


def test_017_runners_are_noted_from_the_scheduler():
    prefill_runner, verify_runner = type("PrefillCudaGraphRunner", (), {})(), type("DecodeCudaGraphRunner", (), {})()
    draft_decode = type("EAGLEDraftCudaGraphRunner", (), {})()
    draft_runner = ns(prefill_cuda_graph_runner=type("PrefillCudaGraphRunner", (), {})(), model=None)
    config = ns(prefill=ns(backend="breakable"), decode=ns(backend="full"))
    scheduler = ns(
        server_args=ns(cuda_graph_config=config, attention_backend="fa3"),
        tp_worker=ns(model_runner=ns(prefill_cuda_graph_runner=prefill_runner, decode_cuda_graph_runner=verify_runner)),
        draft_worker=ns(
            _draft_worker=ns(
                draft_runner=draft_runner, cuda_graph_runner=draft_decode, cuda_graph_runner_for_draft_extend=None
            )
        ),
    )
    facts = engine_facts.facts_of_scheduler(scheduler)
    assert (facts["prefill_graph_backend"], facts["decode_graph_backend"]) == ("breakable", "full")
    assert facts["prefill_graph_runner"] == "PrefillCudaGraphRunner"
    assert facts["draft_prefill_graph_runner"] == "PrefillCudaGraphRunner"
    assert facts["draft_decode_graph_runner"] == "EAGLEDraftCudaGraphRunner"
    f = engine_facts.in_force({"engine_facts": [facts]})  # no log: the runners say it
    assert f["piecewise"] == "on (breakable)" and f["piecewise_runner"] == "PrefillCudaGraphRunner"
    assert f["graphs"] == ("target prefill breakable, target verify full, draft prefill breakable, draft decode full")
    off = dict(facts, prefill_graph_backend="disabled", prefill_graph_runner=None, draft_prefill_graph_runner=None)
    assert engine_facts.in_force({"engine_facts": [off]})["piecewise"] == "off"
    # a release before 0.5.17 has no cuda_graph_config: the piecewise runner is read as before
    before = engine_facts.facts_of_scheduler(
        ns(
            server_args=ns(disable_piecewise_cuda_graph=False),
            tp_worker=ns(model_runner=ns(piecewise_cuda_graph_runner=ns())),
        )
    )
    assert before["prefill_graph_backend"] is None and engine_facts.graph_setup({"engine_facts": [before]}) is None
    assert engine_facts.in_force({"engine_facts": [before]})["piecewise"] == "on"
