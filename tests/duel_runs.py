"""Reading a committed duel run (docs/results/gpu-duel-*/<step>.json) back in the GPU
evidence tests (tests/gpu/test_gpu_duel_fifth.py, test_gpu_duel_sixth.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_e2e import duel_report


def load(run: Path, name: str) -> dict:
    return json.loads((run / f"{name}.json").read_text())


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
