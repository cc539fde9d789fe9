"""The profiles of a yardstick plan, one row per profiled engine (issue 57).

``--profile-batch`` leaves, in each profiled batch of ``results.json``, the summary that
:mod:`.profile_trace` read from sglang's own decode trace (rank 0). This module lays those
summaries side by side, per call of the plan: wall and kernel time per decode step, the GPU
busy fraction, the idle gaps, and what the host asked of the CUDA runtime per step (kernel
launches, async copies, graph launches). Under the profiler a step runs slower than timed
(the host records every runtime call), so the busy fraction is a lower bound; the columns
compare variants profiled alike, not profiled against timed.

    python -m gpu_e2e.yardstick docs/results/gpu-yardstick-2026-11-27   # prints it last
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A plan call's folder: ``fa3_8boff-r2-b12`` -> backend ``fa3_8boff``, round ``r2``, bundle
#: ``b12`` (patched 0.5.12.post1) or ``b17`` (upstream 0.5.17); the yardstick reads it too.
CALL = re.compile(r"^(?P<backend>[a-z0-9_]+)-(?P<round>r\d+)-(?P<bundle>b12|b17)$")
RUNTIME = {
    "launches": ("cudaLaunchKernel", "cudaLaunchKernelExC"),
    "copies": ("cudaMemcpyAsync",),
    "graphs": ("cudaGraphLaunch",),
}

HEADER = (
    "| backend | variant | bs | steps | ms per step | kernels ms per step | GPU busy | gaps ms per step "
    "| kernels per step | kernel launches / async copies / graph launches per step (CUDA runtime calls) |"
)


def _per_step_calls(rank: dict[str, Any]) -> dict[str, float | None]:
    """Runtime calls per step; None where the summary did not record the call (before
    profile_trace.RUNTIME_KEPT, only its top calls were kept: absent is not zero)."""
    steps = rank.get("steps") or 0
    counts = {c["name"]: c["count"] for c in rank.get("runtime_calls", [])}
    out: dict[str, float | None] = {}
    for short, names in RUNTIME.items():
        seen = [counts[n] for n in names if n in counts]
        out[short] = sum(seen) / steps if seen and steps else None
    return out


def rows(folder: Path, label: Callable[[str], str]) -> list[dict]:
    """Every profiled batch of the plan's calls, rank 0, in call-name order."""
    out = []
    for path in sorted(folder.glob("*/results.json")):
        m = CALL.match(path.parent.name)
        if not m:
            continue
        for key, run in sorted(json.loads(path.read_text()).get("runs", {}).items()):
            for batch in run.get("batches", []):
                ranks = (batch.get("profile") or {}).get("ranks") or []
                if not ranks:
                    continue
                rank = ranks[0]
                per = rank["per_step_ms"]
                out.append(
                    {
                        "call": path.parent.name,
                        "backend": label(m["backend"]),
                        "variant": key.rsplit("/", 1)[1],
                        "batch_size": batch["batch_size"],
                        "steps": rank["steps"],
                        "wall_ms": per["wall"],
                        "kernels_ms": per["kernels"],
                        "gaps_ms": per["gaps"],
                        "busy": rank["busy_fraction"],
                        "kernel_launches": per["kernel_launches"],
                        **_per_step_calls(rank),
                    }
                )
    return out


def _n(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def markdown(table: list[dict]) -> str:
    lines = [HEADER, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in table:
        lines.append(
            f"| {r['backend']} | {r['variant']} | {r['batch_size']} | {r['steps']} | {r['wall_ms']:.3f} "
            f"| {r['kernels_ms']:.3f} | {100 * r['busy']:.1f}% | {r['gaps_ms']:.3f} | {r['kernel_launches']:.0f} "
            f"| {_n(r['launches'])} / {_n(r['copies'])} / {_n(r['graphs'])} |"
        )
    return "\n".join(lines) + "\n"
