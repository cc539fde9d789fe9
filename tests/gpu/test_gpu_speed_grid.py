"""docs/gpu.md opens with issue 67's grid: every cell any committed duel timed, recomputed here
from docs/results (gpu_e2e.speed_grid), and the reading rules on small made-up runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from gpu_e2e import evidence, speed_grid

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "gpu.md").read_text()


def test_docs_gpu_md_opens_with_the_grid_as_the_committed_duels_give_it():
    table = speed_grid.markdown(ROOT / "docs" / "results")
    assert table in DOC
    grid = DOC.split("\n## ")[1]  # the first section after the page's introduction
    assert grid.startswith("The speed grid (issue 67)") and table in grid


def test_the_grid_names_the_cells_still_open():
    """The opening paragraph's count of cells below a bar, or too thin to read, is the table's."""
    rows = speed_grid.lines(speed_grid.cells(ROOT / "docs" / "results"))
    below = [r for r in rows if "| below |" in r]
    thin = [r for r in rows if "| thin |" in r]
    untimed = [r for r in rows if r.endswith("| not timed | identical |")]
    said = f"Of these {len(rows)} cells, {len(below)} are below a bar in their latest run, {len(thin)} too thin"
    were = "cell was" if len(untimed) == 1 else "cells were"
    assert said in DOC and f"{len(untimed)} eager {were} never timed beside 0.5.17" in DOC


def _duel(
    folder: Path, name: str, rows: list[tuple], *, size="small", backend="triton", env=None, weights=None, **args
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "args": {
            **args,
            "attention_backend": backend,
            "tp": 1,
            "engine": [{"name": "pristine", "env": {}}, {"name": "patched", "env": env or {}}],
        },
        "engines": {"patched": {"ready": {"size": size, "target_weights": weights}}},
        "summary": [
            {"batch_size": bs, "eager": bs > 32, "pair": pair, "ratios": ratios, "identical": True}
            for bs, pair, ratios in rows
        ],
    }
    (folder / f"{name}.json").write_text(json.dumps(result))


def test_the_latest_run_is_the_newest_folder_and_every_run_is_pooled(tmp_path):
    _duel(tmp_path / "gpu-duel-2026-11-29", "a", [(64, "pristine:patched", [0.9, 0.9, 0.9])])
    _duel(tmp_path / "gpu-duel-2026-11-29b", "a", [(64, "pristine:patched", [1.0, 1.0])])
    _duel(tmp_path / "gpu-duel-2026-11-29b", "b", [(64, "pristine:patched", [1.1])])
    (pair,) = speed_grid.cells(tmp_path)[("Triton", "small", "TP 1", 64, True)].values()
    assert pair.latest() == ("gpu-duel-2026-11-29b", [1.0, 1.0, 1.1])
    assert sorted(pair.pooled()) == [0.9, 0.9, 0.9, 1.0, 1.0, 1.1]
    (line,) = speed_grid.lines(speed_grid.cells(tmp_path))
    assert "| 1.000 (3, 2026-11-29b) | 0.950 (6, 2) | meets |" in line and line.endswith(
        "| not timed |  | not timed | identical |"
    )


def test_a_tree_with_a_switch_on_is_not_the_users_tree(tmp_path):
    _duel(
        tmp_path / "gpu-duel-x", "a", [(8, "pristine:patched", [0.5] * 3)], env={"PATCHKIT_FLASHINFER_HOST_INDPTR": "1"}
    )
    _duel(tmp_path / "gpu-duel-x", "b", [(8, "pristine:patched-graph", [0.5] * 3)])
    assert speed_grid.cells(tmp_path) == {}


def test_the_bars_below_thin_and_captured_cells_against_upstream():
    assert speed_grid.meets("pristine:patched", [0.97, 0.99, 0.975], eager=False) == "below"
    assert speed_grid.meets("pristine:patched", [0.98, 0.97, 0.99], eager=True) == "meets"
    assert speed_grid.meets("pristine:patched", [1.2, 1.2], eager=True) == "thin"
    assert speed_grid.meets("upstream:patched", [0.99] * 5, eager=True) == "below"
    assert speed_grid.meets("upstream:patched", [0.5] * 5, eager=False) == "-"


def test_the_default_backend_is_named_by_the_shape(tmp_path):
    _duel(tmp_path / "gpu-duel-x", "a", [(1, "upstream:patched", [1.0] * 3)], backend="default", size="8b")
    assert list(speed_grid.cells(tmp_path)) == [("FA3", "8b", "TP 1", 1, False)]


def test_a_duel_in_another_scenario_than_its_shapes_own_is_its_own_row(tmp_path):
    _duel(tmp_path / "gpu-duel-x", "a", [(8, "pristine:patched", [1.0] * 3)], scenario="eagle3")
    _duel(tmp_path / "gpu-duel-x", "b", [(8, "pristine:patched", [1.2] * 3)], scenario="standalone")
    _duel(tmp_path / "gpu-duel-x", "c", [(8, "pristine:patched", [1.0] * 3)], size="ds", scenario="mtp")
    _duel(
        tmp_path / "gpu-duel-x", "d", [(8, "pristine:patched", [1.5] * 3)], scenario="standalone", weights={"seed": 1}
    )
    sizes = ["ds", "small", "small standalone", "small standalone random-weights"]
    assert sorted(key[1] for key in speed_grid.cells(tmp_path)) == sizes


def test_a_second_pair_of_engines_of_the_same_trees_reads_the_same_cell(tmp_path):
    rows = [(64, "pristine:patched", [0.9, 0.9, 0.9]), (64, "pristine-again:patched-again", [1.1, 1.1, 1.1])]
    _duel(tmp_path / "gpu-duel-x", "a", rows + [(64, "pristine:pristine-again", [1.0] * 3)])
    (cell,) = speed_grid.cells(tmp_path).values()
    assert list(cell) == ["pristine:patched"] and sorted(cell["pristine:patched"].pooled()) == [0.9] * 3 + [1.1] * 3


def test_the_command_prints_the_table_and_refuses_a_missing_folder(tmp_path, capsys):
    _duel(tmp_path / "gpu-duel-x", "a", [(1, "pristine:patched", [1.0] * 3)])
    assert speed_grid.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == speed_grid.markdown(tmp_path)
    assert speed_grid.main([str(tmp_path / "none")]) == 2
    assert "usage" in capsys.readouterr().err


def test_the_figures_the_opening_cites():
    """The bullets under the grid: Triton 8B eager bs 64 over the fourteenth run's two duels (the
    cell the thirteenth left below its bar) read three ways, and its control's seconds."""
    run = ROOT / "docs" / "results" / "gpu-duel-2026-11-29e"
    duels = [evidence.read_json(run / f"triton_8b_duel-r{n}.json") for n in (1, 2)]
    ratios = [
        x
        for d in duels
        for r in d["summary"]
        if r["pair"] == "pristine:patched" and r["batch_size"] == 64
        for x in r["ratios"]
    ]
    seconds = {e: 0.0 for e in ("pristine", "patched", "patched-again")}
    for d in duels:
        for c in d["calls"]:
            if c["batch_size"] == 64:
                seconds[c["engine"]] += c["elapsed_s"]
    geometric = math.exp(statistics.mean(math.log(x) for x in ratios))
    assert f"reads {statistics.median(ratios):.3f}x pristine\n  over {len(ratios)} rounds" in DOC
    assert f"geometric mean ({geometric:.3f}) and total time ({seconds['pristine'] / seconds['patched']:.3f})" in DOC
    mine, theirs = seconds["patched"] / seconds["patched-again"], seconds["pristine"] / seconds["patched-again"]
    assert f"patched's seconds run {mine:.3f}x the control's, and pristine's\n  run {theirs:.3f}x" in DOC
