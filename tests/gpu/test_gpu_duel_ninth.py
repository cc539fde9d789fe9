"""docs/gpu.md's ninth run (issues 67 and 71, 2026-11-28i): every duel alone on a one-GPU host.
Its tables recomputed from the committed JSON (docs/results/gpu-duel-2026-11-28i), and the
figures its text cites read back."""

from __future__ import annotations

import json
from pathlib import Path

import duel_runs

from gpu_e2e import duel_report, duel_stats, profile_compare

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu-duel-2026-11-28i"
DOC = (ROOT / "docs" / "gpu.md").read_text()
COMMIT = "c9e7184f8b8e2c87130bdefc2fc43aebc1faf82d"
EVERY = ("fa3_8b_duel-r1", "flashinfer_duel-r1")


def _run(name: str) -> dict:
    return duel_runs.load(RUN, name)


def _profile(name: str) -> dict:
    return duel_runs.profile(RUN, name)


def test_every_duel_is_of_its_commit_and_ran_alone():
    for name in EVERY:
        result = _run(name)
        duel_runs.assert_clean(result, COMMIT)
    args = json.loads((RUN / "plan-args.json").read_text())
    assert args["kind"] == "nvidia-h200" and args["env"]["LANES"] == "0"


def test_the_tables_are_the_runs():
    lines = duel_report.grid_lines({"fa3_8b_duel-r1": _run("fa3_8b_duel-r1")})
    lines += duel_report.grid_lines(
        {"flashinfer_duel-r1": _run("flashinfer_duel-r1")}, ("pristine:patched-graph", "upstream:patched-graph")
    )
    assert len(lines) == 10
    for line in lines:
        assert line in DOC, line


def test_each_engines_own_spread_is_as_cited():
    spreads = {}
    for name in EVERY:
        for r in duel_stats.spread(_run(name)):
            if r["batch_size"] in (64, 128):
                line = (
                    f"| {name} | {r['engine']} | {r['batch_size']} | {r['rounds']} | {r['min']:.1f} | "
                    f"{r['max']:.1f} | {r['max_over_min']:.3f} |"
                )
                assert line in DOC, line
                spreads[(name, r["engine"], r["batch_size"])] = r["max_over_min"]
    fa3 = [v for (n, _, _), v in spreads.items() if n == "fa3_8b_duel-r1"]
    assert (min(fa3), max(fa3)) == (1.158, 1.594)
    fi128 = [v for (n, _, bs), v in spreads.items() if n == "flashinfer_duel-r1" and bs == 128]
    assert (min(fi128), max(fi128)) == (1.053, 1.14)
    assert "moves 1.16-1.59x from round to round" in DOC and "own spread is 1.05-1.14x" in DOC
    up = [r["max_over_min"] for r in duel_stats.spread(_run("flashinfer_duel-r1")) if r["engine"] == "upstream"]
    assert (min(up[:3]), max(up[:3])) == (1.192, 1.485) and "itself moved 1.19-1.49x" in DOC


def test_flashinfer_eager_128_is_below_pristine_in_every_round():
    (row,) = [
        r
        for r in _run("flashinfer_duel-r1")["summary"]
        if r["pair"] == "pristine:patched-graph" and r["batch_size"] == 128
    ]
    assert row["eager"] and max(row["ratios"]) < 0.79
    assert f"0.770 of pristine in every round ({min(row['ratios']):.3f}-{max(row['ratios']):.3f})" in DOC


def test_the_fa3_8b_profile_is_as_cited():
    ours, upstream = _profile("fa3_8b_prof-r1"), _profile("fa3_8b_prof17")
    assert ours["wall_us"][:2] == [49224.2, 42333.7] and upstream["wall_us"][:2] == [43025.6, 42333.7]
    kernel = [ours["kernel_union_us"][0], ours["kernel_union_us"][1], upstream["kernel_union_us"][0]]
    assert abs(kernel[1] / kernel[0] - 1) < 0.003 and abs(kernel[1] / kernel[2] - 1) < 0.014
    gathers = upstream["categories_us"]["gathers (index/gather)"]
    assert gathers[:2] == [292.1, 73.6] and "73.6 against\n  292.1 us a step" in DOC
    others = [d for k, (_, _, d) in upstream["categories_us"].items() if not k.startswith("gathers")]
    assert all(abs(d) < 40 for d in others)
    linear = next(op for op in ours["cpu_ops"] if op["name"] == "aten::linear")
    assert linear["calls"] == [141.0, 141.0] and linear["us"] == [7443.2, 6348.7]
    for tree, wall, union, gaps, gather in (
        ("pristine 0.5.12.post1", *ours["wall_us"][:1], *ours["kernel_union_us"][:1], *ours["gaps_us"][:1], 73.1),
        ("patched 0.5.12.post1", ours["wall_us"][1], ours["kernel_union_us"][1], ours["gaps_us"][1], 73.6),
        ("upstream 0.5.17", upstream["wall_us"][0], upstream["kernel_union_us"][0], upstream["gaps_us"][0], 292.1),
    ):
        assert f"| {tree} | {wall:.1f} | {union:.1f} | {gaps:.1f} | {gather:.1f} |" in DOC
        assert 0.59 < gaps / wall < 0.65
    md = profile_compare.markdown(json.loads((RUN / "fa3_8b_prof-r1-compare.json").read_text()))
    assert "| wall | 49224.2 | 42333.7 | -6890.5 |" in md
    assert "| 4128.3 → 3821.0 | 0.926 |" in (RUN / "fa3_8b_prof-r1-table.md").read_text()
    assert "(pristine 4128.3, patched 3821.0 tok/s;" in DOC


def test_fa3_8b_over_four_duels_by_the_verdict():
    eighth = ROOT / "docs" / "results" / "gpu-duel-2026-11-28h"
    runs = [duel_runs.load(eighth, f"fa3_8b_duel-r{i}") for i in (1, 2, 3)] + [_run("fa3_8b_duel-r1")]
    verdicts = {}
    for pair in ("pristine:patched", "upstream:patched"):
        by_bs: dict[int, list[float]] = {}
        for result in runs:
            for row in result["summary"]:
                if row["pair"] == pair:
                    by_bs.setdefault(row["batch_size"], []).extend(row["ratios"])
        for bs, ratios in sorted(by_bs.items()):
            low, high = duel_stats.median_interval(ratios)
            verdicts[(pair, bs)] = duel_stats.verdict(ratios)
            line = f"| {pair} | {bs} | {len(ratios)} | {low:.3f}-{high:.3f} | {verdicts[(pair, bs)]} |"
            assert line in DOC, line
    assert [verdicts[("pristine:patched", bs)] for bs in (1, 8, 32, 64, 128)] == ["above"] * 3 + ["open"] * 2
    captured = [
        x
        for r in runs
        for row in r["summary"]
        if row["pair"] == "pristine:patched" and not row["eager"]
        for x in row["ratios"]
    ]
    assert min(captured) >= 1.07 and "no round of a captured cell fell below 1.07x pristine" in DOC
