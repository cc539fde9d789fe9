"""Per decode step: what each tree's step costs, and what one change to the tree saves.

Issue 42's A/B puts three trees of one release side by side in the same engine
settings, each started once per round with the order flipped every round: the
patched tree of an earlier patchkit without upstream's later fixes, one with the
first fix, and today's. A step's time is a timed generate's wall time over its
decode steps (every request has the same length, so each generate takes the same
number of steps); a change's effect is the per-round difference of the two trees'
medians, so the drift of the machine between rounds cancels. Pure functions over an
orchestrator's ``results.json``: unit-tested on CPU, recomputed from the recorded JSON.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable


def step_ms(batch: dict) -> list[float]:
    """Milliseconds per decode step of each timed generate of one batch."""
    runs = len(batch["elapsed_s"])
    steps_per_run = batch["decode_steps"] / runs
    return [1000.0 * s / steps_per_run for s in batch["elapsed_s"]]


def by_round(results: dict, release: str, size: str, backend: str, variant: str) -> dict[int, dict[int, list[float]]]:
    """{round: {batch size: ms per step of each timed generate}}."""
    out: dict[int, dict[int, list[float]]] = {}
    prefix = f"{release}/{size}/{backend}/"
    for key, run in results["runs"].items():
        if not key.startswith(prefix) or not key.endswith(f"/{variant}"):
            continue
        tag = key[len(prefix) :].split("/")[0]
        rnd = int(tag[1:]) if tag.startswith("r") and tag[1:].isdigit() else 0
        out[rnd] = {b["batch_size"]: step_ms(b) for b in run["batches"]}
    return out


def outputs_digest(batch: dict) -> str:
    """What the tokens were (``output_ids``, or its digest where a slimmed record keeps only that)."""
    if "output_ids_sha256" in batch:
        return batch["output_ids_sha256"]
    return hashlib.sha256(json.dumps(batch["output_ids"]).encode()).hexdigest()


def slim(results: dict) -> dict:
    """The record with every batch's output ids replaced by their sha256 (an 8B run at bs 48
    writes megabytes of ids; equality is what the tables need)."""
    out = json.loads(json.dumps(results))
    for run in out["runs"].values():
        for batch in run.get("batches", []):
            if "output_ids" in batch:
                batch["output_ids_sha256"] = outputs_digest(batch)
                del batch["output_ids"]
    return out


def rows(results: dict, release: str, size: str, backend: str, variants: Iterable[str]) -> list[dict]:
    """One row per batch size: each tree's median ms/step over every timed generate, and
    for each next tree the per-round differences of the medians (earlier minus later)."""
    variants = list(variants)
    per = {v: by_round(results, release, size, backend, v) for v in variants}
    sizes = sorted({bs for v in variants for r in per[v].values() for bs in r})
    out = []
    for bs in sizes:
        row: dict = {"bs": bs, "median_ms": {}, "saved_ms": {}}
        for v in variants:
            row["median_ms"][v] = statistics.median(x for r in per[v].values() for x in r[bs])
        for a, b in zip(variants, variants[1:]):
            rounds = sorted(set(per[a]) & set(per[b]))
            row["saved_ms"][f"{a}->{b}"] = [
                statistics.median(per[a][r][bs]) - statistics.median(per[b][r][bs]) for r in rounds
            ]
        row["identical"] = (
            len(
                {
                    tuple(outputs_digest(b) for b in run["batches"] if b["batch_size"] == bs)
                    for key, run in results["runs"].items()
                    if key.startswith(f"{release}/{size}/{backend}/")
                }
            )
            == 1
        )
        out.append(row)
    return out


def markdown(table: list[dict], variants: list[str]) -> str:
    steps = [f"{a}->{b}" for a, b in zip(variants, variants[1:])]
    head = [
        "bs",
        *(f"{v} ms/step" for v in variants),
        *(f"saved {s} (per round, µs)" for s in steps),
        "identical outputs",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * (len(head) - 1) + "---|"]
    for row in table:
        cells = [str(row["bs"]), *(f"{row['median_ms'][v]:.3f}" for v in variants)]
        cells += [", ".join(f"{1000 * d:+.0f}" for d in row["saved_ms"][s]) for s in steps]
        cells.append("yes" if row["identical"] else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
