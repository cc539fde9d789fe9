"""What a torch profiler trace says about the GPU's time (issue 57): pure functions.

sglang's profiler (``Engine.start_profile``, see :mod:`.profile_run`) writes one Chrome
trace per TP rank, ``<profile id>-TP-<rank>[-DECODE|-EXTEND].trace.json.gz``. For each rank
this reads:

* ``wall_us``: the profiled window, first to last timed event of any kind (with CPU
  activity on, the host's events span the window, not just the kernels);
* ``kernel_union_us``: the GPU's busy time, the union of the kernel intervals (events of
  ``cat`` "kernel") on each device, so kernels that overlap on two streams count once;
* ``busy_fraction`` = kernel union / wall;
* ``gaps``: the idle time between kernels (the host did not feed the GPU), summed, with
  the largest few, and the idle lead-in / tail of the window apart;
* the top kernels by summed time, and the CUDA runtime calls (``cudaGraphLaunch`` against
  ``cudaLaunchKernel`` says whether the steps replayed graphs);
* per decode step (when the window's step count is known): wall, kernels, gaps, launches.

The raw trace never goes into results: only this summary.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

TOP = 10
NAME_CHARS = 160
RUNTIME_TOP = 8
#: Always recorded, however few: a step's launches, copies and graph replays (the top
#: RUNTIME_TOP alone once hid 0.5.17's graph launches behind its event calls).
RUNTIME_KEPT = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaGraphLaunch"})
LARGEST_GAPS = 5
_RANK = re.compile(r"-TP-(\d+)")
_STAGE = re.compile(r"-(DECODE|EXTEND)\.trace\.json")
_TIMED = ("X", "i", "I")


def load_events(path: Path) -> list[dict]:
    """The trace's events: a ``.json.gz`` or ``.json`` file holding ``{"traceEvents": [...]}``
    (torch's export) or a bare list."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    return data.get("traceEvents", []) if isinstance(data, dict) else list(data)


def merge_intervals(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping (start, end) covering the same time as ``intervals``."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _is_kernel(event: dict) -> bool:
    return event.get("ph") == "X" and str(event.get("cat", "")).lower() == "kernel"


def _device_of(event: dict):
    return (event.get("args") or {}).get("device", event.get("pid"))


def _span(event: dict) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0) or 0)


def _per_step(value: float, steps: int | None, digits: int = 3):
    return round(value / steps, digits) if steps else None


def summarize_events(events: list[dict], steps: int | None = None, top: int = TOP) -> dict:
    """The summary of one rank's trace (see the module doc); times in microseconds, per
    step in milliseconds. ``steps``: decode steps in the window, when known."""
    timed = [e for e in events if e.get("ph") in _TIMED and isinstance(e.get("ts"), (int, float))]
    if not timed:
        return {"note": "no timed events in the trace"}
    spans = [_span(e) for e in timed]
    window = (min(s for s, _ in spans), max(e for _, e in spans))
    wall = window[1] - window[0]
    kernels = [e for e in timed if _is_kernel(e)]
    per_device: dict = defaultdict(list)
    for k in kernels:
        per_device[_device_of(k)].append(_span(k))
    union = 0.0
    gaps: list[float] = []
    lead_tail = 0.0
    for intervals in per_device.values():
        merged = merge_intervals(intervals)
        union += sum(e - s for s, e in merged)
        gaps.extend(b[0] - a[1] for a, b in zip(merged, merged[1:]))
        lead_tail += (merged[0][0] - window[0]) + (window[1] - merged[-1][1])
    devices = max(len(per_device), 1)
    gap_sum = sum(gaps)
    out: dict[str, Any] = {
        "wall_us": round(wall, 1),
        "kernels": len(kernels),
        "devices": len(per_device),
        "kernel_sum_us": round(sum(float(k.get("dur", 0) or 0) for k in kernels), 1),
        "kernel_union_us": round(union, 1),
        "busy_fraction": round(union / (wall * devices), 4) if wall > 0 else None,
        "gaps": {
            "sum_us": round(gap_sum, 1),
            "count": len(gaps),
            "largest_us": [round(g, 1) for g in sorted(gaps, reverse=True)[:LARGEST_GAPS]],
            "lead_and_tail_us": round(lead_tail, 1),
        },
        "memcpy_memset_us": round(
            sum(
                float(e.get("dur", 0) or 0)
                for e in timed
                if str(e.get("cat", "")).lower() in ("gpu_memcpy", "gpu_memset")
            ),
            1,
        ),
        "top_kernels": _top(kernels, top),
        "runtime_calls": _runtime_calls(timed),
        "steps": steps,
    }
    if not kernels:
        out["note"] = "no kernel events: the GPU activity was not recorded"
    if steps:
        out["per_step_ms"] = {
            "wall": _per_step(wall / 1000.0, steps),
            "kernels": _per_step(union / 1000.0, steps),
            "gaps": _per_step(gap_sum / 1000.0, steps),
            "kernel_launches": _per_step(len(kernels), steps, 1),
        }
    return out


def _top(kernels: list[dict], top: int) -> list[dict]:
    total = sum(float(k.get("dur", 0) or 0) for k in kernels) or 1.0
    by_name: dict = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        row = by_name[str(k.get("name", "?"))[:NAME_CHARS]]
        row[0] += 1
        row[1] += float(k.get("dur", 0) or 0)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return [
        {"name": name, "count": n, "sum_us": round(us, 1), "share": round(us / total, 4)} for name, (n, us) in ranked
    ]


def _runtime_calls(timed: list[dict]) -> list[dict]:
    calls: dict = defaultdict(lambda: [0, 0.0])
    for e in timed:
        if str(e.get("cat", "")).lower() == "cuda_runtime":
            row = calls[str(e.get("name", "?"))]
            row[0] += 1
            row[1] += float(e.get("dur", 0) or 0)
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][0])
    ranked = [kv for i, kv in enumerate(ranked) if i < RUNTIME_TOP or kv[0] in RUNTIME_KEPT]
    return [{"name": name, "count": n, "sum_us": round(us, 1)} for name, (n, us) in ranked]


def find_traces(folder: Path) -> list[dict]:
    """Every trace file under ``folder``: its path, TP rank and stage (None: no stage suffix)."""
    found = []
    for path in sorted(Path(folder).rglob("*.json*")) if Path(folder).is_dir() else []:
        if not (path.name.endswith(".json") or path.name.endswith(".json.gz")):
            continue
        rank = _RANK.search(path.name)
        stage = _STAGE.search(path.name)
        found.append(
            {"path": path, "rank": int(rank.group(1)) if rank else 0, "stage": stage.group(1) if stage else None}
        )
    return found


def summarize_dir(folder: Path, steps: int | None = None, stage: str = "DECODE") -> dict:
    """One summary per rank of the ``stage`` traces under ``folder`` (the unstaged ones when
    none has that stage: the profile was stopped by hand, so ``steps`` is not known for it).
    A missing or unreadable trace is a note, not an exception."""
    traces = find_traces(folder)
    chosen = [t for t in traces if t["stage"] == stage]
    if not chosen:
        chosen = [t for t in traces if t["stage"] is None]
        steps = None
    out: dict = {"stage": stage, "files": [t["path"].name for t in traces], "ranks": []}
    if not chosen:
        out["note"] = f"no {stage} torch profiler trace under {folder}" + (
            f" (found {', '.join(out['files'])})" if traces else ""
        )
        return out
    for t in sorted(chosen, key=lambda t: t["rank"]):
        try:
            summary = summarize_events(load_events(t["path"]), steps=steps)
        except (OSError, EOFError, ValueError) as exc:  # a truncated gzip, bad JSON
            summary = {"note": f"unreadable trace {t['path'].name}: {type(exc).__name__}: {exc}"}
        out["ranks"].append({"rank": t["rank"], "file": t["path"].name, **summary})
    return out


def line(label: str, summary: dict) -> str:
    """One line for a console: each rank's busy fraction and its per-step split."""
    if summary.get("note") and not summary.get("ranks"):
        return f"{label}: profile: {summary['note']}"
    parts = []
    for r in summary.get("ranks", []):
        if "busy_fraction" not in r:
            parts.append(f"TP{r['rank']} {r.get('note', '?')}")
            continue
        head = f"TP{r['rank']} GPU busy {r['busy_fraction']:.1%} of {r['wall_us'] / 1000:.2f} ms"
        step = r.get("per_step_ms")
        if step:
            head += (
                f" = {r['steps']} steps x {step['wall']:.3f} ms (kernels {step['kernels']:.3f}, "
                f"gaps {step['gaps']:.3f}, {step['kernel_launches']:.0f} kernels/step)"
            )
        if r.get("top_kernels"):
            k = r["top_kernels"][0]
            head += f"; top {k['name'][:60]} {k['share']:.0%}"
        if r.get("note"):
            head += f" ({r['note']})"
        parts.append(head)
    return f"{label}: " + " | ".join(parts)
