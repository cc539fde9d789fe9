"""Pristine against patched, per decode step, from sglang's profiler traces (issue 67).

:mod:`.profile_trace` sums a trace into a busy fraction and its top kernels. To name where
one variant's step spends its extra time, this lays two traces of the same batch side by
side, per decode step, by what the time went to:

* GPU kernels by **category** (:data:`CATEGORIES`, the first pattern that matches a kernel's
  name): FA3's attention and its split combine and scheduler metadata, Triton's attention,
  the gathers (index / gather kernels, e.g. ``req_to_token[req_pool_indices, :bound]``),
  copies (elementwise copies, concatenations, memcpy and memset), the matrix products, the
  rest;
* every kernel name: calls and microseconds per step, sorted by the difference;
* the CUDA runtime calls (launches, ``cudaMemcpyAsync``, ``cudaStreamWaitEvent``, the
  synchronizations, ``cudaMalloc``): calls and host microseconds per step;
* the host's torch ops (``cpu_op`` events): calls and microseconds per step, sorted by the
  difference (``aten::index``, ``aten::empty`` ... say what the host did more of);
* sglang's own phase annotations (``step[TARGET_VERIFY bs=16]`` ...: host and GPU spans);
* the GPU's idle gaps between kernels per step (the host did not feed it).

    python -m gpu_e2e.profile_compare ROOT [--out FILE.json] [--md FILE.md]

ROOT holds the runner's profile folders, ``<key>_<tree>.json.profile-<workload>-bs<N>/``
(each with a ``...-TP-0-DECODE.trace.json.gz``); the step count of each is read from the
runner's results file beside it (``<key>_<tree>.json``), else ``--steps``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from . import profile_trace

CATEGORIES = (
    ("fa3 combine (splits)", re.compile(r"combine", re.I)),
    ("fa3 scheduler metadata", re.compile(r"prepare_varlen|num_splits|scheduler_metadata", re.I)),
    ("fa3 attention", re.compile(r"flash::|flash_fwd|FlashAttn|fmha", re.I)),
    ("triton attention", re.compile(r"_fwd_kernel|decode_att|_fwd_grouped|extend_attention|stage[12]", re.I)),
    ("kv index build", re.compile(r"kv_indices|create_flashinfer|page_table|assign_req|req_to_token", re.I)),
    ("gathers (index/gather)", re.compile(r"index|gather|take", re.I)),
    ("copies (copy/cat/fill)", re.compile(r"copy|cat|Memcpy|Memset|fill|clone", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|matmul|sm90_", re.I)),
)
OTHER = "other kernels"
RUNTIME_KEYS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaGraphLaunch",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaStreamWaitEvent",
    "cudaEventRecord",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaMalloc",
    "cudaFree",
    "cudaHostAlloc",
)
TOP = 25
_FOLDER = re.compile(r"^(?P<key>.+)_(?P<tree>[a-z0-9-]+)\.json\.profile-(?P<workload>[a-z+]+)-bs(?P<bs>\d+)$")


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return OTHER


def step_profile(events: list[dict], steps: int) -> dict:
    """Per decode step: kernel time by category and by name, runtime calls, host torch ops,
    GPU gaps; microseconds (calls: counts) divided by ``steps``."""
    steps = max(int(steps), 1)
    by_cat: dict = defaultdict(float)
    kernels: dict = defaultdict(lambda: [0, 0.0])
    runtime: dict = defaultdict(lambda: [0, 0.0])
    cpu_ops: dict = defaultdict(lambda: [0, 0.0])
    phases: dict = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)):
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", "?"))
        dur = float(e.get("dur", 0) or 0)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            by_cat[category(name) if cat == "kernel" else "copies (copy/cat/fill)"] += dur
            row = kernels[name[: profile_trace.NAME_CHARS]]
            row[0] += 1
            row[1] += dur
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            row = runtime[name]
            row[0] += 1
            row[1] += dur
        elif cat in ("user_annotation", "gpu_user_annotation"):  # sglang's step[VERIFY bs=N] ...
            row = phases[("gpu " if cat.startswith("gpu") else "host ") + name]
            row[0] += 1
            row[1] += dur
        elif cat == "cpu_op":
            row = cpu_ops[name]
            row[0] += 1
            row[1] += dur
    summary = profile_trace.summarize_events(events, steps=steps)

    def per(table: dict) -> dict:
        return {k: {"calls": round(n / steps, 2), "us": round(us / steps, 1)} for k, (n, us) in table.items()}

    return {
        "steps": steps,
        "wall_us": round(summary.get("wall_us", 0) / steps, 1),
        "kernel_union_us": round(summary.get("kernel_union_us", 0) / steps, 1),
        "gaps_us": round(summary.get("gaps", {}).get("sum_us", 0) / steps, 1),
        "categories_us": {k: round(v / steps, 1) for k, v in sorted(by_cat.items())},
        "kernels": per(kernels),
        "runtime": per(runtime),
        "cpu_ops": per(cpu_ops),
        "phases": per(phases),
    }


def _diff_rows(a: dict, b: dict, top: int = TOP) -> list[dict]:
    """Names of ``a`` and ``b`` (name -> {calls, us}) with b - a, largest |us difference| first."""
    rows = []
    for name in set(a) | set(b):
        x, y = a.get(name, {"calls": 0, "us": 0.0}), b.get(name, {"calls": 0, "us": 0.0})
        rows.append(
            {
                "name": name,
                "calls": [x["calls"], y["calls"]],
                "us": [x["us"], y["us"]],
                "diff_us": round(y["us"] - x["us"], 1),
            }
        )
    rows.sort(key=lambda r: (-abs(r["diff_us"]), r["name"]))
    return rows[:top]


def compare(a: dict, b: dict, top: int = TOP) -> dict:
    """``b`` (patched) against ``a`` (pristine), both :func:`step_profile` results."""
    cats = sorted(set(a["categories_us"]) | set(b["categories_us"]))
    return {
        "wall_us": [a["wall_us"], b["wall_us"], round(b["wall_us"] - a["wall_us"], 1)],
        "kernel_union_us": [
            a["kernel_union_us"],
            b["kernel_union_us"],
            round(b["kernel_union_us"] - a["kernel_union_us"], 1),
        ],
        "gaps_us": [a["gaps_us"], b["gaps_us"], round(b["gaps_us"] - a["gaps_us"], 1)],
        "categories_us": {
            c: [
                a["categories_us"].get(c, 0.0),
                b["categories_us"].get(c, 0.0),
                round(b["categories_us"].get(c, 0.0) - a["categories_us"].get(c, 0.0), 1),
            ]
            for c in cats
        },
        "runtime": {
            k: [a["runtime"].get(k, {"calls": 0, "us": 0.0}), b["runtime"].get(k, {"calls": 0, "us": 0.0})]
            for k in RUNTIME_KEYS
            if k in a["runtime"] or k in b["runtime"]
        },
        "kernels": _diff_rows(a["kernels"], b["kernels"], top),
        "cpu_ops": _diff_rows(a["cpu_ops"], b["cpu_ops"], top),
        "phases": _diff_rows(a.get("phases", {}), b.get("phases", {}), top),
    }


def _steps_of(folder: Path, workload: str, bs: int, default: int) -> int:
    res = folder.parent / folder.name.split(".profile-")[0]
    try:
        for batch in json.loads(res.read_text()).get("batches", []):
            if batch.get("batch_size") == bs and batch.get("workload", workload) == workload:
                ranks = (batch.get("profile") or {}).get("ranks") or []
                if ranks and ranks[0].get("steps"):
                    return int(ranks[0]["steps"])
    except (OSError, ValueError):
        pass
    return default


def profiles(root: Path, steps: int = 20) -> dict:
    """``{(key, workload, bs): {tree: step_profile}}`` for every profile folder under ``root``."""
    out: dict = defaultdict(dict)
    for folder in sorted(p for p in Path(root).rglob("*.profile-*") if p.is_dir()):
        m = _FOLDER.match(folder.name)
        if not m:
            continue
        traces = [t for t in profile_trace.find_traces(folder) if t["stage"] == "DECODE" and t["rank"] == 0]
        if not traces:
            continue
        bs = int(m["bs"])
        n = _steps_of(folder, m["workload"], bs, steps)
        out[(m["key"], m["workload"], bs)][m["tree"]] = step_profile(profile_trace.load_events(traces[0]["path"]), n)
    return dict(out)


def report(root: Path, steps: int = 20, base: str = "pristine", other: str = "patched") -> dict:
    found = profiles(root, steps)
    cells = {}
    for (key, workload, bs), trees in sorted(found.items()):
        cell = {"trees": trees}
        if base in trees and other in trees:
            cell["compare"] = compare(trees[base], trees[other])
        cells[f"{key}/{workload}/bs{bs}"] = cell
    return {"base": base, "other": other, "cells": cells}


def markdown(rep: dict) -> str:
    lines = []
    for name, cell in rep["cells"].items():
        c = cell.get("compare")
        if not c:
            continue
        lines.append(f"### {name}: {rep['base']} -> {rep['other']}, microseconds per decode step\n")
        lines.append("| what | " + rep["base"] + " | " + rep["other"] + " | difference |")
        lines.append("|---|---:|---:|---:|")
        for label in ("wall_us", "kernel_union_us", "gaps_us"):
            x, y, d = c[label]
            lines.append(f"| {label.replace('_us', '')} | {x:.1f} | {y:.1f} | {d:+.1f} |")
        for cat, (x, y, d) in c["categories_us"].items():
            lines.append(f"| kernels: {cat} | {x:.1f} | {y:.1f} | {d:+.1f} |")
        for k, (x, y) in c["runtime"].items():
            lines.append(f"| {k} (calls; host us) | {x['calls']}; {x['us']} | {y['calls']}; {y['us']} | |")
        lines.append("\nsglang's annotated phases (host span; GPU span), largest difference first:\n")
        lines.append("| phase | calls | us | difference |")
        lines.append("|---|---|---|---:|")
        for r in c.get("phases", []):
            lines.append(
                f"| `{r['name']}` | {r['calls'][0]} → {r['calls'][1]} | {r['us'][0]} → {r['us'][1]} | {r['diff_us']:+.1f} |"
            )
        lines.append("\nKernels, largest difference first (calls per step; us per step):\n")
        lines.append("| kernel | calls | us | difference |")
        lines.append("|---|---|---|---:|")
        for r in c["kernels"][:12]:
            lines.append(
                f"| `{r['name'][:90]}` | {r['calls'][0]} → {r['calls'][1]} | {r['us'][0]} → {r['us'][1]} | {r['diff_us']:+.1f} |"
            )
        lines.append("\nHost torch ops, largest difference first:\n")
        lines.append("| op | calls | us | difference |")
        lines.append("|---|---|---|---:|")
        for r in c["cpu_ops"][:12]:
            lines.append(
                f"| `{r['name'][:90]}` | {r['calls'][0]} → {r['calls'][1]} | {r['us'][0]} → {r['us'][1]} | {r['diff_us']:+.1f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--steps", type=int, default=20, help="decode steps of a trace whose results file is not beside it")
    ap.add_argument("--base", default="pristine")
    ap.add_argument("--other", default="patched")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    rep = report(args.root, args.steps, args.base, args.other)
    if args.out:
        args.out.write_text(json.dumps(rep, indent=1, sort_keys=True))
    text = markdown(rep)
    if args.md:
        args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
