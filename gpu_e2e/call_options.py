"""GPU side: the orchestrator's command line, and what of it names and orders the runs.

Kept apart from :mod:`.orchestrate` (which runs the engines): the options, each
run's key (``_setting``), a variant's tree and backend, and the ABBA schedule are
read by tests and by the GPU plans without starting anything.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import dp, engine_env


def parser() -> argparse.ArgumentParser:
    """Every option of ``python3 -m pk_gpu_e2e.orchestrate``."""

    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=".")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--work", default="/tmp/pk_gpu_e2e")
    ap.add_argument("--releases", default=None, help="comma list (default: all in the bundle)")
    ap.add_argument("--sizes", default="small,8b")
    ap.add_argument(
        "--variants",
        default="pristine,patched",
        help="of a patched release; a reference release runs its upstream tree. Each is "
        "TREE or TREE@BACKEND: TREE pristine, patched or minus-PATCH (a bundle built with "
        "--minus PATCH), BACKEND an attention backend (default --attention-backend)",
    )
    ap.add_argument(
        "--compare",
        default=None,
        help="A,B: the two variants each round compares (default: pristine,patched, or the "
        "first two variants); outputs must be identical only where A and B use one backend",
    )
    ap.add_argument(
        "--scenario",
        choices=("eagle3", "standalone", "mtp"),
        default="eagle3",
        help="standalone: the draft is the target itself, so steps accept tokens; "
        "mtp: a DeepSeek size (ds, ds-dense) with its own MTP layer as the draft",
    )
    ap.add_argument(
        "--engine-extra",
        default="{}",
        help="JSON object of Engine settings over the rest (page_size, speculative_eagle_topk, "
        "cuda_graph_max_bs, ...), as each engine's settings.md reads them back",
    )
    ap.add_argument("--input-len", type=int, default=32, help="prompt tokens of the uniform workload")
    ap.add_argument("--label", default="", help="a word added to every run's key (one call, two settings)")
    ap.add_argument(
        "--wrap", default="", help="a command put before every runner (e.g. compute-sanitizer --tool memcheck ...)"
    )
    ap.add_argument("--deterministic", action="store_true", help="enable_deterministic_inference in every engine")
    ap.add_argument("--workloads", default="uniform", help="comma list: uniform, mixed, penalized")
    ap.add_argument(
        "--alternate",
        type=int,
        default=0,
        help="N > 0: patched only, N ABBA alternations of mirror kept / dropped "
        "inside each engine (the sync's cost, in one process)",
    )
    ap.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="default 0.6; 0.25 for standalone (the draft copy needs its own room)",
    )
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--profile-batch", default="0", help="BS[,BS...]: one more generate of each under sglang's profiler"
    )
    ap.add_argument(
        "--attention-backend",
        default="triton",
        help='"default": name none, so sglang picks (FA3 on Hopper; read back in settings.md)',
    )
    ap.add_argument(
        "--piecewise",
        choices=("default", "on", "off"),
        default="default",
        help="piecewise CUDA graph as the release defaults it (default), enforced on, or off "
        "(disable_piecewise_cuda_graph=True, as the proofs before issue 40 ran)",
    )
    ap.add_argument(
        "--draft",
        choices=("checkpoint", "dummy"),
        default="checkpoint",
        help="checkpoint: EAGLE3 draft shaped like a published one (draft vocab 32000, d2t); "
        "dummy: the earlier proofs' draft (draft vocab = vocab, no token map)",
    )
    ap.add_argument("--context-length", type=int, default=0, help="0: the models' own (131072)")
    ap.add_argument(
        "--fa3-lib",
        type=Path,
        default=None,
        help="FA3's flash_ops.abi3.so unpacked by fa3_kernel.py (checked, then put beside sgl_kernel)",
    )
    ap.add_argument(
        "--kernels",
        type=Path,
        default=None,
        help="a folder holding kernels/ (bundle_kernels.py; default: the bundle's own)",
    )
    ap.add_argument("--run-timeout", type=int, default=420)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="engine processes per variant, alternating which starts first (ABBA...): "
        "the speed ratio is then read per round, so noise between processes shows",
    )
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tp_size of every engine; above 1 also a row per rank in ranks.md (see ranks.py)",
    )
    engine_env.add_arguments(ap)  # issue 67: the host bound's switches, read back per scheduler
    dp.add_arguments(ap)  # issue 58: DP attention, two-batch overlap, the a2a backend (GPUs: --tp)
    return ap


def _variant(spec: str, default_backend: str) -> tuple[str, str]:
    """``TREE[@BACKEND]`` -> (tree name, attention backend)."""
    tree, _, backend = spec.partition("@")
    return tree, backend or default_backend


def _setting(args) -> str:
    """Key part naming what differs from the first proof's settings ("" when nothing)."""
    parts = [args.label] if getattr(args, "label", "") else []
    if args.scenario != "eagle3":
        parts.append(args.scenario)
    if args.deterministic:
        parts.append("det")
    if args.workloads != "uniform":
        parts.append(args.workloads.replace(",", "+"))
    if args.alternate:
        parts.append(f"alt{args.alternate}")
    if args.tp > 1:
        parts.append(f"tp{args.tp}")
    parts += dp.setting_parts(args)
    if getattr(args, "piecewise", "default") != "default":
        parts.append(f"pw-{args.piecewise}")
    if getattr(args, "draft", "checkpoint") != "checkpoint":
        parts.append(f"draft-{args.draft}")
    if getattr(args, "context_length", 0):
        parts.append(f"ctx{args.context_length}")
    return "-".join(parts) + "/" if parts else ""


def _schedule(sizes: list[str], variants: list[str], rounds: int):
    """(size, round, variants in start order): the order flips every round, so
    a drift of the machine over the call (clocks, heat) hits both variants alike."""
    for size in sizes:
        for rnd in range(rounds):
            yield size, rnd, variants if rnd % 2 == 0 else variants[::-1]
