"""One variant, one model size, one fresh process: start sglang.Engine, generate, time.

Run by :mod:`.orchestrate` as ``python -m <pkg>.runner --tree-parent DIR ...`` with the
tree's parent folder first on ``PYTHONPATH`` (so ``import sglang`` is that tree) and,
when sync counting is on, ``PK_E2E_SYNC_DIR`` set (see :mod:`.syncs`).

Settings (issue 10): EAGLE3, topk 1, 3 steps, 4 draft tokens, Triton attention (or
``--attention-backend``), CUDA graphs on, overlap scheduler on (spec v2), piecewise
CUDA graph off, greedy, ``ignore_eos``, dummy weights, ``skip_tokenizer_init`` with
``input_ids``. For each batch size: one warm-up generate, then ``--runs`` timed ones.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from . import ranks, syncs
from .models import SIZES, write_models

SPEC = dict(
    speculative_algorithm="EAGLE3",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)


def prompts(batch_size: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch_size)]


def engine_kwargs(target: Path, draft: Path, *, attention_backend: str, cuda_graph_max_bs: int,
                  mem_fraction_static: float, tp_size: int = 1) -> dict:
    return dict(
        model_path=str(target),
        speculative_draft_model_path=str(draft),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        attention_backend=attention_backend,
        sampling_backend="pytorch",
        disable_piecewise_cuda_graph=True,
        cuda_graph_max_bs=cuda_graph_max_bs,
        mem_fraction_static=mem_fraction_static,
        random_seed=1234,
        log_level="info",
        **ranks.engine_kwargs(tp_size),
        **SPEC,
    )


def _sync_table(sync_dir: str | None) -> dict:
    if not sync_dir:
        return {}
    for _ in range(3):  # let every process's flusher write its last counts
        time.sleep(0.5)
    return syncs.aggregate(syncs.read_dir(sync_dir))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree-parent", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--mem-fraction-static", type=float, default=0.6)
    ap.add_argument("--tp", type=int, default=1, help="tp_size of the engine (one scheduler process per rank)")
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    sync_dir = os.environ.get(syncs.ENV_DIR)
    tree_parent = str(Path(args.tree_parent).resolve())
    if sys.path[0] != tree_parent:
        sys.path.insert(0, tree_parent)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    target, draft = write_models(Path(args.models_dir), args.size)

    import sglang

    result = {
        "variant": args.variant,
        "size": args.size,
        "attention_backend": args.attention_backend,
        "sglang_file": sglang.__file__,
        "sglang_version": getattr(sglang, "__version__", "?"),
        "patchkit_importable": _patchkit_where(),
        "input_len": args.input_len,
        "max_new_tokens": args.max_new_tokens,
        "tp_size": args.tp,
        "batches": [],
    }
    from sglang.srt.entrypoints.engine import Engine

    kwargs = engine_kwargs(target, draft, attention_backend=args.attention_backend,
                           cuda_graph_max_bs=max(max(batch_sizes), 8),
                           mem_fraction_static=args.mem_fraction_static, tp_size=args.tp)
    result["engine_kwargs"] = kwargs
    t0 = time.perf_counter()
    engine = Engine(**kwargs)
    result["engine_start_s"] = round(time.perf_counter() - t0, 1)
    print(f"[runner] engine up in {result['engine_start_s']} s", flush=True)
    try:
        sp = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
        vocab = SIZES[args.size]["vocab_size"]
        for bs in batch_sizes:
            ids = prompts(bs, args.input_len, vocab, seed=bs)
            engine.generate(input_ids=ids, sampling_params=sp)  # warm-up
            before = _sync_table(sync_dir)
            before_ranks = ranks.read(sync_dir)
            runs = []
            for _ in range(args.runs):
                t = time.perf_counter()
                outs = engine.generate(input_ids=ids, sampling_params=sp)
                elapsed = time.perf_counter() - t
                completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
                verify = sum(o["meta_info"].get("spec_verify_ct", 0) or 0 for o in outs)
                runs.append({
                    "elapsed_s": elapsed,
                    "completion_tokens": completion,
                    "verify_ct": verify,
                    "output_ids": [list(o["output_ids"]) for o in outs],
                })
            after = _sync_table(sync_dir)
            after_ranks = ranks.read(sync_dir)
            timed = syncs.delta(after, before)
            med = statistics.median(r["elapsed_s"] for r in runs)
            toks = runs[0]["completion_tokens"]
            verify = sum(r["verify_ct"] for r in runs)
            batch = {
                "batch_size": bs,
                "elapsed_s": [round(r["elapsed_s"], 4) for r in runs],
                "median_s": med,
                "tok_per_s": toks / med,
                "ms_per_token": 1000.0 * med / (toks / bs),
                "accept_length": (sum(r["completion_tokens"] for r in runs) / verify) if verify else None,
                "deterministic": all(r["output_ids"] == runs[0]["output_ids"] for r in runs),
                "output_ids": runs[0]["output_ids"],
                "syncs": syncs.syncs_only(timed),
                "decode_steps": syncs.calls_of(timed, "prepare_for_decode"),
                "ranks": ranks.batch_per_rank(after_ranks, before_ranks),
                "verify_ct": verify,
            }
            result["batches"].append(batch)
            print(f"[runner] {args.variant} {args.size} bs={bs}: {batch['tok_per_s']:.1f} tok/s "
                  f"accept {batch['accept_length']} steps {batch['decode_steps']} "
                  f"syncs {sum(batch['syncs'].values())}", flush=True)
        result["syncs_whole_run"] = syncs.syncs_only(_sync_table(sync_dir))
        result["ranks"] = ranks.run_per_rank(ranks.read(sync_dir))
    finally:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
        engine.shutdown()
    return 0


def _patchkit_where() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("patchkit")
    return spec.origin if spec else None


if __name__ == "__main__":
    sys.exit(main())
