"""Host cost of the FlashInfer host plans (issue 71), on the CPU.

    python scripts/bench_host_plans.py [--batch-sizes 1,8,32,128] [--baseline REV]

With ``PATCHKIT_FLASHINFER_HOST_INDPTR=1`` a spec-v2 step builds its plan arrays
on the host (``patchkit/backends/flashinfer_host_indptr.py``): the verify's,
the eager draft extend's and the multi-step draft's indptrs, and a decode
plan's last-page lengths for each draft step. An eager step of the GPU runs is
host-bound (one Python thread), so these microseconds add to it directly.
Prints the best of five medians, in µs a call, per builder and batch size
(EAGLE3 shaped: 4 draft tokens, 3 steps, top-k 1; lengths near 100), and a step's
sum (verify + draft extend + draft indptr + 3 last-page arrays). With
``--baseline REV`` the module as it stands at git revision REV runs beside it.

Without CUDA nothing is pinned, so the figures leave out the pinned
allocations, which a GPU host adds once per fresh host array (a step's fresh
arrays: docs/research/flashinfer-spec-v2.md counts them).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

MODULE = "patchkit/backends/flashinfer_host_indptr.py"
ROOT = Path(__file__).resolve().parent.parent
DRAFT_TOKENS, STEPS, TOPK = 4, 3, 1
BUILDERS = ("verify", "draft extend", "draft indptr", "last-page ones")  # the keys of builders()


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def at_revision(rev: str) -> Path:
    text = subprocess.run(["git", "show", f"{rev}:{MODULE}"], cwd=ROOT, capture_output=True, text=True, check=True)
    path = Path(tempfile.mkdtemp()) / "flashinfer_host_indptr_baseline.py"
    path.write_text(text.stdout)
    return path


def best_median_us(call, runs: int = 5, calls: int = 400) -> float:
    for _ in range(50):
        call()
    medians = []
    for _ in range(runs):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return min(medians) * 1e6


def builders(module, bs: int) -> dict:
    seq = torch.randint(90, 110, (bs,), dtype=torch.int32, generator=torch.Generator().manual_seed(bs))
    total = int(seq.sum())
    spec = SimpleNamespace(
        spec_input_type=SimpleNamespace(name="EAGLE_VERIFY"), draft_token_num=DRAFT_TOKENS, positions=torch.zeros(bs)
    )
    backend = SimpleNamespace(dispatch_reason=None)
    batch = SimpleNamespace(
        seq_lens_cpu=seq,
        spec_info=spec,
        batch_size=bs,
        seq_lens_sum=total,
        forward_mode=SimpleNamespace(is_draft_extend_v2=lambda: True),
        extend_prefix_lens_cpu=(seq - 1).tolist(),
    )
    return {
        "verify": lambda: module.verify_host_plan(backend, spec, seq, bs, total),
        "draft extend": lambda: module.draft_extend_host_plan(backend, batch, True),
        "draft indptr": lambda: module.draft_host_indptr(batch, TOPK, STEPS),
        "last-page ones": lambda: module._host_ones(bs * TOPK),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--baseline", help="a git revision whose module runs beside this checkout's")
    args = ap.parse_args(argv)
    os.environ["PATCHKIT_FLASHINFER_HOST_INDPTR"] = "1"
    modules = {"this checkout": load("host_plans_now", ROOT / MODULE)}
    if args.baseline:
        modules[f"at {args.baseline}"] = load("host_plans_baseline", at_revision(args.baseline))
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}; µs a call, best of 5 medians of 400")
    print("| batch size | builder | " + " | ".join(modules) + " |")
    print("|---:|---|" + "---:|" * len(modules))
    for bs in (int(b) for b in args.batch_sizes.split(",")):
        step = dict.fromkeys(modules, 0.0)
        for builder in BUILDERS:
            cells = []
            for name, module in modules.items():
                us = best_median_us(builders(module, bs)[builder])
                step[name] += us * (STEPS if builder == "last-page ones" else 1)
                cells.append(f"{us:.1f}")
            print(f"| {bs} | {builder} | " + " | ".join(cells) + " |")
        print(f"| {bs} | **a step** | " + " | ".join(f"**{us:.1f}**" for us in step.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
