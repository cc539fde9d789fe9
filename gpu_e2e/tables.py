"""Print a committed GPU step's tables again from its results JSON:

    python -m gpu_e2e.tables docs/results/gpu-hw-2026-11-26/s12-fa3

On the machine the orchestrator wrote them beside ``results.json``: ``table.md`` (the
wrapper's sync counts a decode step, then torch's host waits by site where they were
counted), ``speed.md`` (each round's rate, where a call ran rounds) and ``ranks.md`` (one row
a rank, tensor parallel above 1). They are copies of the JSON, so they are not committed
(docs/results/README.md); this prints the same text, which ``tests/gpu`` reads where a
test once read the committed copy.

A step compares its ``--compare`` pair (``"BEFORE,AFTER"``), else pristine against patched:
every run key ``.../BEFORE`` with a ``.../AFTER`` beside it and batches in both, in key order,
the release being the key's first part."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from . import orchestrate, rank_report, report


def load(step: Path) -> dict:
    return json.loads((step / "results.json").read_text())


def pairs(results: Mapping) -> list[tuple[str, Mapping, Mapping]]:
    """(release, before, after) for every compared pair of runs, in key order."""
    before, after = (results.get("args", {}).get("compare") or "pristine,patched").split(",")
    runs = results["runs"]
    out = []
    for key in sorted(runs):
        other = key[: -len(before)] + after
        if key.endswith(f"/{before}") and runs[key].get("batches") and runs.get(other, {}).get("batches"):
            out.append((key.split("/")[0], runs[key], runs[other]))
    return out


def rows(results: Mapping) -> list[dict]:
    """The rows of table.md and speed.md (``report.compare`` over every pair)."""
    return [row for release, before, after in pairs(results) for row in report.compare(release, before, after)]


def rank_rows(results: Mapping) -> list[dict]:
    """The rows of ranks.md (``rank_report.compare`` over every pair)."""
    return [row for release, before, after in pairs(results) for row in rank_report.compare(release, before, after)]


def table(results: Mapping) -> str:
    """table.md: the wrapper's counts a decode step, then torch's host waits (where counted)."""
    return orchestrate.tables(rows(results))


def speed(results: Mapping) -> Optional[str]:
    """speed.md: each round's rate, where the call ran rounds (``--rounds`` above 1; else None)."""
    return report.speed_markdown(rows(results)) if results.get("args", {}).get("rounds", 1) > 1 else None


def ranks(results: Mapping) -> Optional[str]:
    """ranks.md: one row a rank, where the engines ran tensor parallel (``--tp`` above 1; else None)."""
    return rank_report.markdown(rank_rows(results)) if results.get("args", {}).get("tp", 1) > 1 else None


PRINTERS = {"table.md": table, "speed.md": speed, "ranks.md": ranks}


def text(step: Path, name: str) -> Optional[str]:
    """``name`` (table.md, speed.md or ranks.md) of ``step``: the committed file where there is
    one (runs whose JSON was compacted before this printer cannot print it again, so theirs
    stay), else printed from ``results.json`` (None: the run wrote none)."""
    path = step / name
    return path.read_text() if path.exists() else PRINTERS[name](load(step))


def copies(results_root: Path) -> list[Path]:
    """Committed table.md / speed.md / ranks.md files this module prints again byte for byte
    from the ``results.json`` beside them: copies, which docs/results/ does not keep."""
    found = []
    for path in sorted(results_root.rglob("*.md")):
        if path.name in PRINTERS and (path.parent / "results.json").is_file():
            try:
                again = PRINTERS[path.name](load(path.parent))
            except (KeyError, TypeError, ValueError):  # a JSON compacted to what its tests read
                continue
            if again == path.read_text():
                found.append(path)
    return found


def printed(step: Path) -> str:
    results = load(step)
    parts = [("table.md", table(results)), ("speed.md", speed(results)), ("ranks.md", ranks(results))]
    return "".join(f"# {name}\n\n{body}\n" for name, body in parts if body)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "results.json").is_file():
        print("usage: python -m gpu_e2e.tables STEP_FOLDER (a folder with results.json)", file=sys.stderr)
        return 2
    sys.stdout.write(printed(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
