"""docs/gpu.md's twelfth run (issues 67 and 71, 2026-11-29c): FA3 8B eager bs 64 and FlashInfer
small eager bs 128 over many rounds, every engine on the same cores and rotated. Its tables
recomputed from the committed JSON (docs/results/gpu-duel-2026-11-29c), and the figures its
text cites read back."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import duel_runs

from gpu_e2e import duel_report, duel_stats

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-29c"
ELEVENTH = ROOT / "docs" / "results" / "gpu-duel-2026-11-29b"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "8d4aab21f04b5b9f842e7d88c57fd2cb23b9e98f"
FI = ("flashinfer_duel-r1", "flashinfer_duel-r2")
FI_PAIRS = ("pristine:patched", "pristine:patched-hostplan", "patched:patched-hostplan")


def _run(name: str, run: Path = RUN) -> dict:
    return duel_runs.load(run, name)


def _pair(name: str, pair: str, run: Path = RUN) -> list[float]:
    (row,) = [r for r in _run(name, run)["summary"] if r["pair"] == pair]
    return row["ratios"]


def _verdict_line(name: str, pair: str, bs: int, ratios: list[float]) -> str:
    low, high = duel_stats.median_interval(ratios)
    return (
        f"| {name} | {pair} | {bs} | {len(ratios)} | {sum(x < 1 for x in ratios)} | "
        f"{statistics.median(ratios):.3f} | {low:.3f}-{high:.3f} | {duel_stats.verdict(ratios)} | "
        f"{duel_stats.verdict(ratios, bar=1.0)} |"
    )


def test_every_duel_is_of_its_commit_on_shared_cores_and_rotated():
    for name in ("fa3_8b_duel-bs64", *FI):
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)
        assert result["args"]["cpus"] == [4, 5, 6, 7] and result["args"]["rotate"]
    args = json.loads((RUN / "plan-args.json").read_text())
    assert args["kind"] == "nvidia-h200" and args["env"]["DUEL_CPUS"] == "4-7" and args["env"]["WITH17"] == "none"
    switch = {e["name"]: e["env"] for e in _run(FI[0])["args"]["engine"]}
    assert switch == {"pristine": {}, "patched": {}, "patched-hostplan": {"PATCHKIT_FLASHINFER_HOST_INDPTR": "1"}}


def test_the_tables_are_the_runs():
    fa3 = duel_report.grid_lines({"fa3_8b_duel-bs64": _run("fa3_8b_duel-bs64")}, ("pristine:patched",))
    fi = duel_report.grid_lines({n: _run(n) for n in FI}, FI_PAIRS)
    assert len(fa3 + fi) == 3
    for line in fa3 + fi:
        assert line in DOC, line


def test_the_verdicts_with_the_pooled_rounds():
    bs64 = _pair("fa3_8b_duel-bs64", "pristine:patched")
    before = _pair("fa3_8b_duel-bs64", "pristine:patched", ELEVENTH)
    lines = [
        _verdict_line("fa3_8b_duel-bs64", "pristine:patched", 64, bs64),
        _verdict_line("with the eleventh run's bs 64", "pristine:patched", 64, bs64 + before),
    ]
    for pair in FI_PAIRS:
        a, b = (_pair(n, pair) for n in FI)
        lines += [
            _verdict_line(FI[0], pair, 128, a),
            _verdict_line(FI[1], pair, 128, b),
            _verdict_line("flashinfer r1 and r2 pooled", pair, 128, a + b),
        ]
    for line in lines:
        assert line in DOC, line
    assert (len(bs64), round(statistics.median(bs64), 3), sum(x < 1 for x in bs64)) == (67, 1.007, 30)
    assert "1.007 over 67 rounds (interval 0.978-1.068,\n  30 rounds below 1), 1.004 pooled" in DOC


def test_flashinfer_figures_are_as_cited():
    plain = [_pair(n, "pristine:patched") for n in FI]
    assert [round(statistics.median(r), 3) for r in plain] == [0.936, 1.003]
    assert round(statistics.median(plain[0] + plain[1]), 3) == 0.988
    plan = _pair(FI[0], "pristine:patched-hostplan") + _pair(FI[1], "pristine:patched-hostplan")
    against_off = _pair(FI[0], "patched:patched-hostplan") + _pair(FI[1], "patched:patched-hostplan")
    assert (round(statistics.median(plan), 3), round(statistics.median(against_off), 3)) == (0.990, 1.025)
    assert "0.990x pristine and 1.025x the switch off" in DOC
    assert "the first 18 read 0.936, the next 38 1.003" in DOC


def test_each_engines_spread_is_as_cited():
    spread = {r["engine"]: r["max_over_min"] for r in duel_stats.spread(_run("fa3_8b_duel-bs64"))}
    assert spread == {"patched": 1.922, "pristine": 2.331}
    assert "(here: patched 1.92x,\n  pristine 2.33x over the 67)" in DOC


def test_the_flashinfer_research_table_is_the_runs():
    doc = (ROOT / "docs" / "research" / "flashinfer-spec-v2.md").read_text()

    def cell(ratios: list[float], interval: bool = False) -> str:
        text = f"{statistics.median(ratios):.3f}"
        return text + (" ({:.3f}-{:.3f})".format(*duel_stats.median_interval(ratios)) if interval else "")

    eleventh = [_pair("flashinfer_duel-r1", p, ELEVENTH) for p in FI_PAIRS]
    first, second = ([_pair(n, p) for p in FI_PAIRS] for n in FI)
    pooled = [a + b for a, b in zip(first, second)]
    rows = [
        f"| 2026-11-29b | 3 | {' | '.join(cell(r) for r in eleventh)} |",
        f"| 2026-11-29c, first duel | 18 | {' | '.join(cell(r) for r in first)} |",
        f"| 2026-11-29c, second duel | 38 | {' | '.join(cell(r) for r in second)} |",
        f"| 2026-11-29c pooled | 56 | {' | '.join(cell(r, interval=True) for r in pooled)} |",
    ]
    for row in rows:
        assert row in doc, row
