"""docs/gpu.md's third run of the grid (issue 67, the duel): the second lease's tables
recomputed from the committed duel JSON (docs/results/gpu-duel-2026-11-28c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_e2e import duel_report, evidence

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28c"
DOC = (ROOT / "docs" / "gpu.md").read_text()
LEFT_OUT = {
    0: ("fa3-spec-v2", "seq-lens-host-bound"),
    1: ("spec-v2-decode-copies", "verify-wait-on-stream"),
    2: ("min-new-tokens-no-sync", "draft-replay-grouped-copy"),
    3: ("fa3-draft-extend-graph",),
}


def _runs() -> dict[int, dict]:
    return {gpu: evidence.read_json(RUN / f"minus-gpu{gpu}.json") for gpu in LEFT_OUT}


def _row(result: dict, bs: int, pair: str) -> dict:
    (row,) = [r for r in result["summary"] if r["batch_size"] == bs and r["pair"] == pair]
    return row


@pytest.mark.parametrize("gpu", sorted(LEFT_OUT))
def test_each_duel_summary_is_its_calls(gpu):
    """Every row is the calls' own ratios, every engine ran its rounds, the outputs are one."""
    result = _runs()[gpu]
    assert (
        duel_report.summary(result["calls"], duel_report.pairs_of(result["args"]["compare"]), 32) == result["summary"]
    )
    assert "H200" in result["device"] and all(e["failure"] is None for e in result["engines"].values())
    assert set(result["engines"]) == {"pristine", "patched", *(f"minus-{i}" for i in LEFT_OUT[gpu])}
    assert all(r["identical"] and r["eager"] for r in result["summary"])


def test_the_left_out_table_is_recomputed():
    for gpu, result in _runs().items():
        base = [_row(result, bs, "pristine:patched") for bs in (64, 128)]
        cells = "; ".join(f"{r['median']:.3f}" for r in base)
        assert f"| {gpu} | {base[0]['rounds']} | {cells} | `{LEFT_OUT[gpu][0]}` |" in DOC, gpu
        for patch in LEFT_OUT[gpu]:
            rows = [_row(result, bs, f"patched:minus-{patch}") for bs in (64, 128)]
            line = "; ".join(f"{r['median']:.3f}" for r in rows)
            assert f"| `{patch}` | {line}" in DOC.replace("**", ""), (gpu, patch, line)
    lead = _row(_runs()[0], 128, "patched:minus-fa3-spec-v2")
    assert sum(r >= 1 for r in lead["ratios"]) == 8 and lead["rounds"] == 10


def test_the_pooled_table_is_recomputed():
    pooled = duel_report.pooled(list(_runs().values()), "pristine:patched")
    for p in pooled:
        line = (
            f"| {p['batch_size']} | {p['rounds']} | {p['median']:.3f} | {p['at_least_1']} | {p['min']:.3f} "
            f"| {p['max']:.3f} |"
        )
        assert line in DOC, line
    assert [p["median"] for p in pooled] == [1.029, 0.999]
