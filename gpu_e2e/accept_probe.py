"""Why STANDALONE does not accept at batch size 1: the prompt or the batch size? (issue 23)

The accepted-runs scenario (draft = target, see :mod:`.runner`) accepted 4 tokens a
step at bs 2-32 but about 1 at bs 1. The runner draws each batch size's prompts
from its own seed, so "bs 1" is also "the seed-1 prompt". This probe separates the
two in one engine (docs/research/standalone-accept-bs1.md, experiment E1):

* ``P1`` alone and inside a batch of two with another prompt;
* each of the 32 prompts of the bs-32 batch alone, then all 32 as one batch.

Each request's accept length (completion tokens / verify steps) and output are
recorded. If a prompt accepts the same alone and in a batch, acceptance belongs to
the request, not to the batch size. ``--no-cuda-graph`` repeats it eagerly (E2:
rules out a graph captured for bs 1 only).

    PYTHONPATH=<tree parent>:<site>:e2e python3 -m pk_gpu_e2e.accept_probe --models-dir M --out probe.json

:func:`summarise` is pure and unit-tested on CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

from . import workloads
from .models import SIZES, write_models
from .runner import engine_kwargs
from .timed_calls import accept_of


def summarise(
    alone: dict[str, tuple[Optional[float], list[int]]], batched: dict[str, tuple[Optional[float], list[int]]]
) -> dict:
    """``{prompt: (accept, output)}`` alone and in a batch -> per prompt both accept
    lengths and whether the output is the same; ``request_bound`` when every prompt
    accepts the same (within 0.05) and writes the same tokens both ways."""
    rows: list[dict[str, Any]] = []
    for name in sorted(alone, key=_order):
        a_acc, a_out = alone[name]
        b_acc, b_out = batched[name]
        rows.append(
            {
                "prompt": name,
                "alone": a_acc,
                "batched": b_acc,
                "same_output": a_out == b_out,
                "same_accept": a_acc is not None and b_acc is not None and abs(a_acc - b_acc) <= 0.05,
            }
        )
    return {
        "rows": rows,
        "request_bound": bool(rows) and all(r["same_accept"] and r["same_output"] for r in rows),
        "accepting_alone": sum(1 for r in rows if (r["alone"] or 0) > 3.0),
    }


def _order(name: str) -> tuple:
    head, _, idx = name.partition("[")
    return head, int(idx.rstrip("]") or 0)


def _run(engine, requests) -> list[tuple[float | None, list[int]]]:
    return [(accept_of(o), list(o["output_ids"])) for o in workloads.generate(engine, requests)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--mem-fraction-static", type=float, default=0.25)
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument(
        "--piecewise",
        choices=("default", "on", "off"),
        default="default",
        help="piecewise CUDA graph as the release defaults it (default); the probe recorded in "
        "docs/results/gpu-2026-11-24/accept-probe-*/probe.json ran before issue 40 with off",
    )
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    target, draft = write_models(Path(args.models_dir), args.size)
    kwargs = engine_kwargs(
        target,
        draft,
        attention_backend="triton",
        cuda_graph_max_bs=32,
        mem_fraction_static=args.mem_fraction_static,
        scenario="standalone",
        piecewise=args.piecewise,
    )
    if args.no_cuda_graph:
        kwargs["disable_cuda_graph"] = True
    vocab = SIZES[args.size]["vocab_size"]

    def prompts(n: int) -> list[workloads.Request]:
        return workloads.uniform(n, input_len=args.input_len, max_new_tokens=args.max_new_tokens, vocab=vocab, seed=n)

    p1, p2, p32 = prompts(1), prompts(2), prompts(32)
    from sglang.srt.entrypoints.engine import Engine

    engine = Engine(**kwargs)
    try:
        _run(engine, p2)  # warm-up
        alone, batched = {}, {}
        alone["P1[0]"] = _run(engine, p1)[0]
        alone["P2[0]"] = _run(engine, p2[:1])[0]
        pair = _run(engine, [p1[0], p2[0]])
        batched["P1[0]"], batched["P2[0]"] = pair
        for i, r in enumerate(p32):
            alone[f"P32[{i}]"] = _run(engine, [r])[0]
        for i, got in enumerate(_run(engine, p32)):
            batched[f"P32[{i}]"] = got
    finally:
        engine.shutdown()
    result = {"args": vars(args), "engine_kwargs": {k: str(v) for k, v in kwargs.items()}, **summarise(alone, batched)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for row in result["rows"]:
        print(
            f"[probe] {row['prompt']:8s} alone {row['alone']} batched {row['batched']} "
            f"same output {row['same_output']}",
            flush=True,
        )
    print(
        f"[probe] request-bound: {result['request_bound']}; "
        f"{result['accepting_alone']}/{len(result['rows'])} prompts accept > 3 alone",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
