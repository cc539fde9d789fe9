"""The scale settings of issue 58 on the command line: DP attention, two-batch overlap,
the MoE all-to-all backend. One set of options, read alike by the orchestrator (which
forwards them, names them in each run's key) and the runner (which hands them to
:func:`ranks.engine_kwargs`). The GPU count check stays ``--tp``: under DP attention
the DP ranks share the TP group's GPUs (``--tp 4 --dp 4`` runs on four).
"""

from __future__ import annotations

import argparse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dp", type=int, default=1, help="dp_size of the engine (with --dp-attention: DP attention)")
    ap.add_argument("--dp-attention", action="store_true", help="enable_dp_attention")
    ap.add_argument("--tbo", action="store_true", help="enable_two_batch_overlap (needs an a2a backend)")
    ap.add_argument(
        "--moe-a2a-backend", default=None, help="moe_a2a_backend (e.g. deepep; default: the release's, none)"
    )


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The keywords :func:`ranks.engine_kwargs` takes beside ``tp_size``."""
    return dict(dp_size=args.dp, dp_attention=args.dp_attention, tbo=args.tbo, moe_a2a_backend=args.moe_a2a_backend)


def forwarded(args: argparse.Namespace) -> list[str]:
    """The same options again, for the runner's command line."""
    argv = ["--dp", str(args.dp)]
    if args.dp_attention:
        argv.append("--dp-attention")
    if args.tbo:
        argv.append("--tbo")
    if args.moe_a2a_backend:
        argv += ["--moe-a2a-backend", args.moe_a2a_backend]
    return argv


def setting_parts(args: argparse.Namespace) -> list[str]:
    """Words of a run's key (after ``tp4``): ``dp4``, ``dpa``, ``a2a-deepep``, ``tbo``."""
    parts = []
    if getattr(args, "dp", 1) > 1:
        parts.append(f"dp{args.dp}")
    if getattr(args, "dp_attention", False):
        parts.append("dpa")
    if getattr(args, "moe_a2a_backend", None):
        parts.append(f"a2a-{args.moe_a2a_backend}")
    if getattr(args, "tbo", False):
        parts.append("tbo")
    return parts
