"""One patch's own effect: the ``minus-PATCH`` tree beside ``patched`` in each B12 call (issue 57).

A bundle built with ``--minus PATCH`` carries every patch but PATCH as the tree
``minus-PATCH``; ``plan.sh`` with ``VARIANTS12`` runs it beside ``patched`` in one call,
one engine each, the start order flipping with the round. Per backend, round and batch
size: tok/s without the patch and with it, their ratio, the wrapper's event waits per
decode step (``Event.synchronize`` and the like: where the patch moves a host wait onto the
stream, this is the count that changes), and whether the outputs are identical token for
token (they must be: the two trees differ by one patch, on one backend).

    python -m gpu_e2e.yardstick docs/results/gpu-verify-wait-2026-11-27   # ends with this table
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

from . import yardstick

MINUS = "minus-"


def _minus_tree(results: dict) -> Optional[str]:
    """The ``minus-PATCH`` variant a call ran, if any."""
    return next(
        (key.rsplit("/", 1)[1] for key in results.get("runs", {}) if key.rsplit("/", 1)[1].startswith(MINUS)), None
    )


def rows(folder: Path) -> list[dict]:
    """One row per backend, round and batch size of each B12 call that ran a minus tree."""
    out = []
    for (backend, rnd), sides in sorted(yardstick.load(folder).items()):
        b12 = sides.get("b12")
        minus = _minus_tree(b12) if b12 else None
        if minus is None:
            continue
        without, with_ = yardstick._batches(b12, minus), yardstick._batches(b12, yardstick.PATCHED)
        for bs in sorted(set(without) & set(with_)):
            a, b = without[bs], with_[bs]
            same, n = yardstick._identical_requests(a, b)
            out.append(
                {
                    "backend": backend,
                    "round": rnd,
                    "batch_size": bs,
                    "patch": minus[len(MINUS) :],
                    "tok_per_s": (a["tok_per_s"], b["tok_per_s"]),
                    "ratio": b["tok_per_s"] / a["tok_per_s"],
                    "event_waits_per_step": (yardstick.event_waits_per_step(a), yardstick.event_waits_per_step(b)),
                    "identical_requests": (same, n),
                }
            )
    return out


def markdown(table: list[dict]) -> str:
    """The rounds, then per backend and batch size the median of their ratios."""
    if not table:
        return ""
    patch = table[0]["patch"]
    lines = [
        f"| backend | round | bs | tok/s without `{patch}` → with | ratio "
        "| event waits per decode step, without → with | outputs identical |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for r in table:
        (a, b), (wa, wb), (same, n) = r["tok_per_s"], r["event_waits_per_step"], r["identical_requests"]
        lines.append(
            f"| {yardstick.label(r['backend'])} | {r['round']} | {r['batch_size']} | {a:.0f} → {b:.0f} "
            f"| {r['ratio']:.3f} | {yardstick._f(wa)} → {yardstick._f(wb)} | {same} of {n} requests |"
        )
    groups: dict[tuple[str, int], list[float]] = {}
    for r in table:
        groups.setdefault((r["backend"], r["batch_size"]), []).append(r["ratio"])
    lines += ["", f"| backend | bs | rounds | with / without `{patch}`, median |", "|---|---:|---:|---:|"]
    for (backend, bs), ratios in sorted(groups.items()):
        lines.append(f"| {yardstick.label(backend)} | {bs} | {len(ratios)} | {statistics.median(ratios):.3f} |")
    return "\n".join(lines) + "\n"
