"""The verdict compares per-step rates (issue 67, item 4): a sync site new in patched at 0.00
per decode step (one idle batch of a run) is a note, not NOT OK; at 0.01 or more it still fails."""

from __future__ import annotations

from gpu_e2e import rank_report, report, sites, wait_report

PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
DEC = "sglang/srt/managers/scheduler_output_processor_mixin.py:process_batch_result_decode"
IDLE = "sglang/srt/managers/scheduler_output_processor_mixin.py:process_batch_result_idle"
STEPS = 1024


def _batch(syncs, steps=STEPS):
    return {
        "batch_size": 8,
        "syncs": syncs,
        "decode_steps": steps,
        "output_ids": [[1, 2]],
        "tok_per_s": 100.0,
        "ms_per_token": 1.0,
        "accept_length": 1.0,
        "deterministic": True,
        "sync_debug_armed": True,
    }


def _run(batch):
    return {"size": "ds", "batches": [batch], "syncs_whole_run": {}, "syncs_startup": {}}


PRISTINE = {f"cpu|{PFD}:174": STEPS, f"sync|{PFD}:174": STEPS, f"wait|{DEC}:474": STEPS}
PATCHED = {f"wait|{DEC}:474": STEPS}


def _rows(extra):
    return report.compare("0.5.12.post1", _run(_batch(PRISTINE)), _run(_batch({**PATCHED, **extra})))


def test_split_by_rate_keeps_a_site_at_half_a_hundredth_or_more_per_step_a_problem():
    new = ["a", "b", "c"]
    assert sites.split_by_rate(new, {"a": 4, "b": 6, "c": 1000}, 1024) == (["b", "c"], ["a"])
    assert sites.split_by_rate(new, {"a": 4}, 0) == (["a", "b", "c"], [])  # no steps counted: all problems


def test_a_site_new_in_patched_at_0_00_per_step_is_a_note_not_not_ok():
    (row,) = _rows({f"wait|{IDLE}:462": 4, f"sync|{IDLE}:462": 4})  # one idle batch over 1024 steps
    assert row["new_sites"] == [] and row["new_sites_negligible"] == [f"wait {IDLE}"]
    assert row["waits"]["new"] == [] and row["waits"]["new_negligible"] == [IDLE]
    assert report.verdict([row]) == [] and wait_report.problems([row]) == []
    notes = sites.negligible_notes([row])
    assert len(notes) == 2 and all("0.00 per step (1024 steps; a note, not a problem)" in n for n in notes)
    assert IDLE in notes[0] and "torch's count" in notes[1]


def test_a_site_new_in_patched_at_0_01_per_step_still_fails():
    (row,) = _rows({f"wait|{IDLE}:462": 11, f"sync|{IDLE}:462": 11})
    assert row["new_sites"] == [f"wait {IDLE}"] and row["new_sites_negligible"] == []
    assert any("new sync sites in patched: wait " + IDLE in p for p in report.verdict([row]))
    assert any("pristine never waits at: " + IDLE in p for p in wait_report.problems([row]))
    assert sites.negligible_notes([row]) == []


def _rank_run(syncs, steps=STEPS):
    batch = {**_batch(syncs, steps), "ranks": [{"tp_rank": 0, "syncs": syncs, "decode_steps": steps}]}
    return {"size": "ds", "batches": [batch], "ranks": [], "tp_size": 1}


def test_rank_rows_split_by_the_same_rate():
    pristine = _rank_run(PRISTINE)
    rows = rank_report.compare("0.5.12.post1", pristine, _rank_run({**PATCHED, f"wait|{IDLE}:462": 4}))
    (row,) = [r for r in rows if r["tp_rank"] == 0]
    assert row["new_sites"] == [] and row["new_sites_negligible"] == [f"wait {IDLE}"]
    assert not any("new sync sites" in p for p in rank_report.verdict(rows, tp=1))
    assert "rank 0" in sites.negligible_notes(rows)[0]
