"""Reading a committed duel run (docs/results/gpu-duel-*/<step>.json) back in the GPU
evidence tests (tests/gpu/test_gpu_duel_fifth.py ... test_gpu_duel_tenth.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gpu_e2e import duel_report, duel_stats, evidence


def load(run: Path, name: str) -> dict:
    """A committed duel as it was written (its packed calls read back: gpu_e2e.evidence)."""
    return evidence.read_json(run / f"{name}.json")


def profile(run: Path, name: str) -> dict:
    """The one cell of a committed ``<name>-compare.json`` (profile_compare's): its comparison."""
    (cell,) = json.loads((run / f"{name}-compare.json").read_text())["cells"].values()
    return cell["compare"]


def assert_recomputes(result: dict, commit: str) -> None:
    """A committed duel is what its calls say: its summary recomputed from them, on an H200,
    every engine's tree from patchkit ``commit``."""
    eager_above = json.loads(result["args"]["engine_extra"])["cuda_graph_max_bs"]
    pairs = duel_report.pairs_of(result["args"]["compare"])
    assert duel_report.summary(result["calls"], pairs, eager_above) == result["summary"]
    assert "H200" in result["device"] and set(result["patchkit_commit"].values()) == {commit}


def assert_clean(result: dict, commit: str) -> None:
    """:func:`assert_recomputes`, every engine alive to the end and every output identical."""
    assert_recomputes(result, commit)
    assert all(e["failure"] is None for e in result["engines"].values())
    assert all(r["identical"] for r in result["summary"])


def per_step(result: dict) -> dict[tuple[str, int], dict]:
    """Host waits a decode step, by (engine, batch size): duel_report.waits keyed."""
    return {(w["engine"], w["batch_size"]): w for w in duel_report.waits(result["calls"])}


def outputs(result: dict, bs: int) -> dict[str, set[str]]:
    """Each engine's output digests at batch size ``bs``, over the calls that did not fail."""
    got: dict[str, set[str]] = {}
    for c in result["calls"]:
        if c["batch_size"] == bs and "error" not in c:
            got.setdefault(c["engine"], set()).add(c["outputs_sha256"])
    return got


def verdict_line(name: str, row: dict) -> str:
    """docs/gpu.md's verdict-table row for one summary row of duel ``name`` (from the
    thirteenth run on): rounds, rounds below 1, median, its 95% interval, both bars."""
    ratios = row["ratios"]
    interval = duel_stats.median_interval(ratios)
    shown = "{:.3f}-{:.3f}".format(*interval) if interval else "-"
    return (
        f"| {name} | {row['pair']} | {row['batch_size']} | {'eager' if row['eager'] else 'captured'} | "
        f"{len(ratios)} | {sum(x < 1 for x in ratios)} | {statistics.median(ratios):.3f} | {shown} | "
        f"{duel_stats.verdict(ratios)} | {duel_stats.verdict(ratios, bar=1.0)} |"
    )


def assert_verdict_rows(run: Path, names: tuple[str, ...], text: str) -> None:
    """Every summary row of each duel ``names`` of ``run`` is a row of the page's verdict table ``text``."""
    for name in names:
        for row in load(run, name)["summary"]:
            line = verdict_line(name, row)
            assert line in text, line
