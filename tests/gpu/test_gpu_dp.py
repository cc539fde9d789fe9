"""The recorded 4-GPU runs of issue 58 (docs/results/gpu-dp-2026-11-27/, docs/gpu.md's
section "DeepSeek at TP 4 with DP attention, 4 GPUs"): every step's table.md and
ranks.md recomputed from its results.json, each per-rank row of docs/gpu.md recomputed
from the JSON (decision, prepare_for_decode and host waits per step, busy / idle
steps, identical outputs, tok/s), the patched trees' digest, and the refused TBO step's
cause read back from its engine log. No GPU needed."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import engine_facts, orchestrate, rank_report, report, tables, wait_report, worker_steps
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUNS = repo_root() / "docs" / "results" / "gpu-dp-2026-11-27"
RELEASE = "0.5.12.post1"
SERVED = {"dp-tp4": "mtp-tp4", "dp-dpa": "mtp-tp4-dp4-dpa"}
TBO = f"{RELEASE}/ds/default/mtp-tp4-dp4-dpa-a2a-deepep-tbo"
IMPORT_ERROR = (
    "ImportError: DeepEP is not installed. Please install DeepEP package from https://github.com/deepseek-ai/deepep."
)


def _results(step: str) -> dict:
    return json.loads((RUNS / step / "results.json").read_text())


def _pair(step: str) -> tuple[dict, dict]:
    runs = _results(step)["runs"]
    return tuple(runs[f"{RELEASE}/ds/default/{SERVED[step]}/{v}"] for v in ("pristine", "patched"))


def _rank_rows(step: str) -> list[dict]:
    return rank_report.compare(RELEASE, *_pair(step))


def _section() -> str:
    text = (repo_root() / "docs" / "gpu.md").read_text()
    return text.split("## DeepSeek at TP 4 with DP attention, 4 GPUs (issue 58")[1].split("\n## ")[0]


def _doc_rows() -> list[dict]:
    """The per-rank table of docs/gpu.md's section, one dict per (step, bs, rank)."""
    lines = _section().split("| step | bs | ranks |")[1].split("\n\n")[0].splitlines()[2:]
    rows, step = [], None
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        step = cells[0].split("`")[1] if cells[0] else step
        for rank in cells[2].split(" (")[0].split(", "):
            rows.append({"step": step, "bs": int(cells[1].split()[0]), "rank": int(rank), "cells": cells[3:]})
    return rows


def _cells(r: dict) -> list[str]:
    """A rank_report row as docs/gpu.md's columns write it."""
    pair = lambda xs: " → ".join(rank_report._f(x) for x in xs)  # noqa: E731
    steps = " → ".join(f"{worker_steps.busy(s)} / {int(s.get('idle', 0))}" for s in r["worker_steps"])
    return [
        str(r["decision"]),
        pair(r["prepare_per_step"]),
        pair(r["waits_per_step"]),
        pair(r["wrapper_per_step"]),
        steps,
        "yes" if r["identical"] else "no",
        " → ".join(f"{x:.1f}" for x in r["tok_per_s"]),
    ]


@pytest.mark.parametrize("step", sorted(SERVED))
def test_tables_recomputed_from_the_json(step):
    data = _results(step)
    pristine, patched = _pair(step)
    rows = report.compare(RELEASE, pristine, patched)
    assert orchestrate.tables(rows) == tables.text(RUNS / step, "table.md")
    assert rank_report.markdown(_rank_rows(step)) == tables.text(RUNS / step, "ranks.md")
    assert data["problems"] == [] and rank_report.verdict(_rank_rows(step), tp=4) == []
    assert wait_report.problems(rows) == []
    assert all(r["identical"] for r in rows) and pristine["rc"] == patched["rc"] == 0


def test_every_per_rank_row_of_docs_gpu_md_is_the_json_s():
    documented = _doc_rows()
    got = {(step, r["batch_size"], r["tp_rank"]): _cells(r) for step in SERVED for r in _rank_rows(step)}
    assert sorted((d["step"], d["bs"], d["rank"]) for d in documented) == sorted(got)  # every rank, once
    for d in documented:
        assert d["cells"] == got[(d["step"], d["bs"], d["rank"])], d


def test_every_rank_took_the_same_decision_and_waits_no_more():
    for step in SERVED:
        pristine, patched = _pair(step)
        assert [r["decisions"] for r in patched["ranks"]] == [[False]] * 4
        assert all(r["decisions"] == [] for r in pristine["ranks"])
        for r in _rank_rows(step):
            before, after = r["waits_per_step"]
            assert after <= before, (step, r["batch_size"], r["tp_rank"])
            if worker_steps.busy(r["worker_steps"][0]):
                assert r["prepare_per_step"][1] == 0.0


def test_idle_dp_ranks_at_bs_1_wait_only_on_copies_and_alike_in_both_trees():
    """bs 1 under DP attention (#33973's shape): ranks 0 and 3 idle every step; what they
    wait on is init_new's pageable non_blocking copies only, the same in both trees, and
    from_schedule_batch's copies there are never a torch sync."""
    for run in _pair("dp-dpa"):
        (bs1,) = [b for b in run["batches"] if b["batch_size"] == 1]
        for rank in bs1["ranks"]:
            idle = worker_steps.busy(rank["worker_steps"]) == 0
            assert idle == (rank["tp_rank"] in (0, 3))
            if idle:
                sites = wait_report.blocking_sites(rank["syncs"])
                assert list(sites) == ["sglang/srt/model_executor/forward_batch_info.py:init_new"]
                assert not [k for k in rank["syncs"] if k.startswith("sync|")]
                assert sum(n for k, n in rank["syncs"].items() if "from_schedule_batch" in k) == 4 * 258


def test_the_patched_tree_is_one_and_the_same_in_every_step_and_named_in_the_doc():
    section = _section()
    digests = set()
    for step in (*SERVED, "dp-tbo"):
        data = _results(step)
        assert data["device"].splitlines() == ["NVIDIA H200, 143771 MiB, 580.159.04"] * 4
        assert data["patchkit_commit"].startswith("973575c")
        digests.add(tree_digest(data["trees"][RELEASE]["patched_files_sha256"]))
    assert digests == {"4b0b587c1a4846e4"}
    assert "`4b0b587c1a4846e4`" in section and "973575c" in section and "4 × NVIDIA H200" in section


def test_tbo_was_refused_at_start_up_and_the_log_names_why():
    data = _results("dp-tbo")
    log = (RUNS / "dp-tbo" / "engine.log").read_text()
    for variant in ("pristine", "patched"):
        run = data["runs"][f"{TBO}/{variant}"]
        assert run["rc"] == 3 and not run.get("batches")
        assert run["engine_failure"].startswith("RuntimeError: Rank 0 scheduler died during initialization")
        assert run["engine_kwargs"]["enable_two_batch_overlap"] is True
        section = log.split(f"===== {TBO}/{variant} =====")[1].split("\n===== ")[0]
        assert engine_facts.failure_line(section) == IMPORT_ERROR  # what the harness now reports
    assert "`ImportError: DeepEP is not installed." in _section()
