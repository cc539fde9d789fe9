"""Issue 67's speed grid, read from a plan's results folder: pristine against patched 0.5.12.post1,
per backend and batch size, one ratio a round (each round one orchestrator call that timed both
trees on one GPU, the order flipped between rounds), and the median over the rounds.

    python -m gpu_e2e.grid docs/results/gpu-grid-2026-11-28

A step folder is ``<backend>-r<N>-b12`` (``fa3``, ``triton``, ``fa3_8b`` ...): the ratio of a
batch size is patched tok/s over pristine tok/s, each the whole generate's rate over its timed
runs (``report.compare``'s). Batch sizes above the engines' ``cuda_graph_max_bs`` ran eager.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from . import report

RELEASE = "0.5.12.post1"
STEP = re.compile(r"^(?P<cell>[a-z0-9_]+)-(?P<round>r\d+)-b12$")


def _pair(results: Mapping) -> tuple[Mapping, Mapping]:
    runs = results["runs"]
    pick = {key.rsplit("/", 1)[1]: run for key, run in runs.items()}
    return pick["pristine"], pick["patched"]


def rows(folder: Path) -> list[dict]:
    """One row a (cell, round, batch size): both rates, the ratio, identical outputs, eager or not."""
    out = []
    for step in sorted(p for p in folder.iterdir() if p.is_dir() and STEP.match(p.name)):
        results = json.loads((step / "results.json").read_text())
        if {key.rsplit("/", 1)[1] for key in results["runs"]} != {"pristine", "patched"}:
            continue  # an env step: the patched tree alone
        pristine, patched = _pair(results)
        graph_max = patched["engine_kwargs"].get("cuda_graph_max_bs")
        match = STEP.match(step.name)
        assert match is not None
        for row in report.compare(RELEASE, pristine, patched):
            out.append(
                {
                    "cell": match["cell"],
                    "round": match["round"],
                    "batch_size": row["batch_size"],
                    "eager": graph_max is not None and row["batch_size"] > graph_max,
                    "tok_per_s": row["tok_per_s"],
                    "ratio": row["ratio"],
                    "identical": row["identical"],
                }
            )
    return out


def median_ratio(table: list[dict], cell: str, batch_size: int) -> Optional[float]:
    ratios = [r["ratio"] for r in table if r["cell"] == cell and r["batch_size"] == batch_size]
    return statistics.median(ratios) if ratios else None


def markdown(table: list[dict]) -> str:
    """The grid: a row a (cell, batch size), each round's ratio, their median, identical outputs."""
    lines = [
        "| cell | bs | ran | rounds | patched / pristine tok/s per round | median | identical outputs |",
        "|---|---:|---|---|---|---:|---|",
    ]
    cells = sorted({(r["cell"], r["batch_size"]) for r in table})
    for cell, bs in cells:
        mine = sorted((r for r in table if r["cell"] == cell and r["batch_size"] == bs), key=lambda r: r["round"])
        ran = "eager" if mine[0]["eager"] else "captured"
        rounds = ", ".join(r["round"] for r in mine)
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in mine)
        identical = "yes" if all(r["identical"] for r in mine) else "no"
        lines.append(
            f"| {cell} | {bs} | {ran} | {rounds} | {ratios} | {median_ratio(table, cell, bs):.3f} | {identical} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(markdown(rows(Path(args[0]))), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
