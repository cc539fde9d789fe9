"""docs/gpu.md's opening table (issue 67): every cell of the speed grid, from every committed duel.

    python -m gpu_e2e.speed_grid docs/results

A cell is a backend, a model shape, its parallelism, a batch size and whether that batch ran
eager (above ``cuda_graph_max_bs``). Each duel JSON (``docs/results/gpu-duel-*/<step>.json``)
gives its rounds' wall-time ratios for ``pristine:patched`` and ``upstream:patched``, where
``patched`` is the tree as users get it: an engine that turned a ``PATCHKIT_`` switch on is
named otherwise (``patched-hostplan``, ``patched-graph``) and is not read here. The table shows,
per cell and pair:

- the **latest run**: the rounds of the newest run folder that timed the cell (folders sort by
  date, ``gpu-duel-2026-11-29`` before ``-29b``), pooled over that folder's duels, which share
  one patchkit commit;
- **every run pooled**: all rounds of every folder, older commits included, so a cell whose
  latest run is thin or kind still shows what came before.

A cell meets its bar when the latest run's median, over at least :data:`MIN_ROUNDS` rounds, is
at or above it (issue 67: 0.98 against pristine everywhere, 1.0 against 0.5.17 in the eager
cells); "thin" where the latest run has fewer rounds. No cell is left out: a duel's every
summary row of the two pairs lands in one.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PAIRS = ("pristine:patched", "upstream:patched")
BARS = {"pristine:patched": 0.98, "upstream:patched": 1.0}
MIN_ROUNDS = 3
#: a second pair of engines of the same two trees (plan.sh PRISTINE_AGAIN=1) reads the same cell:
#: such a duel gives the cell two ratios a round, one per pair of engines
SAME_TREES = {"pristine-again:patched-again": "pristine:patched"}
#: the backend sglang picks when none is named (``default``), per model shape, on Hopper
DEFAULT_BACKEND = {"small": "FA3", "8b": "FA3", "ds": "FA3", "dsv32": "NSA"}
#: the spec scenario each model shape's duels run unless told otherwise (duel.py --scenario)
OWN_SCENARIO = {"small": "eagle3", "8b": "eagle3", "ds": "mtp", "dsv32": "mtp"}
NAMES = {"flashinfer": "FlashInfer", "triton": "Triton", "fa3": "FA3"}


@dataclass
class Pair:
    """One pair's rounds in one cell, run folder by run folder (oldest first)."""

    runs: dict[str, list[float]] = field(default_factory=dict)
    identical: bool = True

    def latest(self) -> tuple[str, list[float]]:
        name = max(self.runs)
        return name, self.runs[name]

    def pooled(self) -> list[float]:
        return [r for ratios in self.runs.values() for r in ratios]


def _shape(result: dict) -> tuple[str, str, str]:
    """(backend, size, parallelism) of a duel, from its arguments and its patched engine."""
    args, ready = result["args"], result["engines"]["patched"].get("ready") or {}
    size = ready.get("size") or args.get("size") or "?"
    backend = args.get("attention_backend") or "default"
    name = DEFAULT_BACKEND.get(size, "default") if backend == "default" else NAMES.get(backend, backend)
    par = f"TP {args.get('tp', 1)}" + (f" + DP attention {args['dp']}" if args.get("dp_attention") else "")
    # a duel in another spec scenario than its shape's own (standalone at a Llama shape) is its own row
    if args.get("scenario", OWN_SCENARIO.get(size)) != OWN_SCENARIO.get(size):
        size = f"{size} {args['scenario']}"
    if ready.get("target_weights"):
        size += " random-weights"  # target_weights.py: a draft that accepts, so other rates a token
    return name, size, par


def _users_tree(result: dict) -> bool:
    """Whether the duel's ``patched`` engine is the tree as shipped (no ``PATCHKIT_`` switch set)."""
    (patched,) = [e for e in result["args"]["engine"] if e["name"] == "patched"] or [None]
    return patched is not None and not any(k.startswith("PATCHKIT_") for k in patched.get("env") or {})


def cells(results: Path) -> dict[tuple, dict[str, Pair]]:
    """Every cell any committed duel timed: ``(backend, size, parallelism, bs, eager)`` to its pairs."""
    out: dict[tuple, dict[str, Pair]] = {}
    for path in sorted(results.glob("gpu-duel-*/*.json")):
        result = json.loads(path.read_text())
        if "summary" not in result or "patched" not in result.get("engines", {}) or not _users_tree(result):
            continue
        shape = _shape(result)
        for row in result["summary"]:
            name = SAME_TREES.get(row["pair"], row["pair"])
            if name not in PAIRS or not row["ratios"]:
                continue
            key = (*shape, row["batch_size"], bool(row["eager"]))
            pair = out.setdefault(key, {}).setdefault(name, Pair())
            pair.runs.setdefault(path.parent.name, []).extend(row["ratios"])
            pair.identical &= bool(row["identical"])
    return out


def meets(pair_name: str, ratios: list[float], eager: bool) -> str:
    """The cell's answer for one pair: "meets", "below" or "thin" (or "-" where no bar applies)."""
    if pair_name == "upstream:patched" and not eager:
        return "-"  # issue 67 asks 1.0x 0.5.17 of the eager cells only
    if len(ratios) < MIN_ROUNDS:
        return "thin"
    return "meets" if statistics.median(ratios) >= BARS[pair_name] else "below"


def _cell(pair: Optional[Pair], name: str, eager: bool) -> list[str]:
    if pair is None:
        return ["not timed", "", meets(name, [], eager).replace("thin", "not timed")]
    run, ratios = pair.latest()
    pooled = pair.pooled()
    return [
        f"{statistics.median(ratios):.3f} ({len(ratios)}, {run.removeprefix('gpu-duel-')})",
        f"{statistics.median(pooled):.3f} ({len(pooled)}, {len(pair.runs)})",
        meets(name, ratios, eager),
    ]


def lines(table: dict[tuple, dict[str, Pair]]) -> list[str]:
    """The markdown rows, cell by cell: backend and shape, then batch size."""
    out = []
    for key in sorted(table):
        backend, size, par, bs, eager = key
        pairs = table[key]
        same = all(p.identical for p in pairs.values())
        row = [f"{backend} {size}, {par}", str(bs), "eager" if eager else "captured"]
        for name in PAIRS:
            row += _cell(pairs.get(name), name, eager)
        row.append("identical" if same else "differ")
        out.append("| " + " | ".join(row) + " |")
    return out


HEADER = (
    "| cell | bs | graph | pristine:patched, latest run (rounds, run) | every run pooled (rounds, runs) "
    "| >= 0.98 | upstream:patched, latest run | every run pooled | >= 1.0 (eager) | outputs |\n"
    "|---|---:|---|---|---|---|---|---|---|---|"
)


def markdown(results: Path) -> str:
    return HEADER + "\n" + "\n".join(lines(cells(results))) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m gpu_e2e.speed_grid RESULTS_FOLDER (docs/results)", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
