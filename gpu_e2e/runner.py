"""One variant, one model size, one fresh process: start sglang.Engine, generate, time.

Run by :mod:`.orchestrate` as ``python -m <pkg>.runner --tree-parent DIR ...`` with the
tree's parent folder first on ``PYTHONPATH`` (so ``import sglang`` is that tree) and,
when sync counting is on, ``PK_E2E_SYNC_DIR`` set (see :mod:`.syncs`).

Settings (issue 10): EAGLE3, topk 1, 3 steps, 4 draft tokens, Triton attention (or
``--attention-backend``), CUDA graphs on, overlap scheduler on (spec v2), greedy,
``ignore_eos``, dummy weights (seeded random ones where ``PK_E2E_TARGET_WEIGHTS=random``:
:mod:`.target_weights`), ``skip_tokenizer_init`` with ``input_ids``. For each
workload and batch size: one warm-up generate, then ``--runs`` timed ones.

Issue 40: what users run, by default. Piecewise CUDA graph as the release defaults it
(``--piecewise off`` passes ``disable_piecewise_cuda_graph=True`` as the earlier
proofs did, ``on`` passes ``enforce_piecewise_cuda_graph=True``);
``--attention-backend default`` names none, so sglang picks (FA3 on Hopper); the
draft is checkpoint-shaped (:mod:`.models`, :mod:`.draft_checkpoint`). What was in
force is read back from the engine's processes (:mod:`.engine_facts`) once it is up,
together with the sync table at that moment (``syncs_startup``, :mod:`.sites`).

Issue 23 adds:

* ``--scenario standalone``: sglang's spec-v2 STANDALONE worker with the draft model
  path set to the target's own folder. Dummy weights are seeded per parameter shape,
  so the draft is the target and predicts what it verifies: steps accept several
  tokens (``--deterministic`` adds ``enable_deterministic_inference``, whose
  batch-invariant kernels make the draft's one-token decode and the target's
  four-token verify compute the same logits at batch size 1 too);
* ``--workloads uniform,mixed`` (:mod:`.workloads`);
* ``--alternate N``: instead of ``--runs``, N alternations (ABBA) of "mirror kept" and
  "mirror dropped" generate calls in this one process (:mod:`.mirror_control`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import (
    deepseek,
    dp,
    draft_checkpoint,
    duel_serve,
    engine_env,
    engine_facts,
    kernel_gaps,
    mirror_control,
    profile_run,
    ranks,
    server_args_names,
    syncs,
    target_weights,
    workloads,
)
from .models import DRAFTS, SIZES, write_models
from .timed_calls import _settled_table, _sync_table, alternated_runs, timed_runs

#: mtp (issue 44): DeepSeek's own MTP layer as the draft, named as users name it
#: (NEXTN; sglang reads it as EAGLE), no draft path (the target's folder).
SCENARIOS = {"eagle3": "EAGLE3", "standalone": "STANDALONE", "mtp": "NEXTN"}
ALL_SIZES = sorted(SIZES) + sorted(deepseek.SIZES)

PIECEWISE = ("default", "on", "off")

SPEC = dict(
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)


def engine_kwargs(
    target: Path,
    draft: Path,
    *,
    attention_backend: str,
    cuda_graph_max_bs: int,
    mem_fraction_static: float,
    scenario: str = "eagle3",
    deterministic: bool = False,
    tp_size: int = 1,
    piecewise: str = "default",
    draft_kind: str = "checkpoint",
    context_length: int = 0,
    engine_extra: dict | None = None,
    scale: dict | None = None,
    target_load_format: str = "dummy",
) -> dict:
    """The Engine's settings; ``attention_backend`` "default" and ``piecewise``
    "default" name nothing, so the release's own defaults decide. ``engine_extra``
    (issue 44: page size, top-k, draft tokens, captured batch size) goes over the rest;
    ``scale`` (issue 58: :func:`dp.engine_kwargs`) goes to :func:`ranks.engine_kwargs`."""
    extra: dict = {"enable_deterministic_inference": True} if deterministic else {}
    if attention_backend != "default":
        extra["attention_backend"] = attention_backend
    if piecewise == "off":
        extra["disable_piecewise_cuda_graph"] = True
    elif piecewise == "on":
        extra["enforce_piecewise_cuda_graph"] = True
    elif piecewise != "default":
        raise ValueError(f"piecewise {piecewise!r}: one of {', '.join(PIECEWISE)}")
    if draft_kind == "checkpoint" and scenario == "eagle3":
        extra["speculative_draft_load_format"] = "auto"  # the draft's safetensors, whatever the target's
    if context_length:
        extra["context_length"] = context_length
    if scenario == "mtp":
        draft_path = None  # as users serve DeepSeek MTP: sglang takes the target's folder
    else:  # STANDALONE drafts with a copy of the target itself (see the module doc).
        draft_path = str(target if scenario == "standalone" else draft)
    kwargs = dict(
        model_path=str(target),
        speculative_algorithm=SCENARIOS[scenario],
        speculative_draft_model_path=draft_path,
        load_format=target_load_format,  # "auto": target_weights.py's checkpoint
        skip_tokenizer_init=True,
        dtype="bfloat16",
        sampling_backend="pytorch",
        cuda_graph_max_bs=cuda_graph_max_bs,
        mem_fraction_static=mem_fraction_static,
        random_seed=1234,
        log_level="info",
        **ranks.engine_kwargs(tp_size, **(scale or {})),
        **SPEC,
        **extra,
    )
    kwargs.update(engine_extra or {})
    return kwargs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree-parent", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--size", choices=ALL_SIZES, required=True)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="eagle3")
    ap.add_argument(
        "--deterministic", action="store_true", help="enable_deterministic_inference (batch-invariant kernels)"
    )
    ap.add_argument("--workloads", default="uniform", help="comma list of " + ", ".join(workloads.WORKLOADS))
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--alternate", type=int, default=0, help="N > 0: N ABBA alternations of mirror kept / dropped instead of --runs"
    )
    ap.add_argument("--attention-backend", default="triton", help='"default": name none (sglang picks)')
    ap.add_argument(
        "--piecewise",
        choices=PIECEWISE,
        default="default",
        help="piecewise CUDA graph: the release's default, enforced on, or off",
    )
    ap.add_argument("--draft", choices=DRAFTS, default="checkpoint")
    ap.add_argument("--context-length", type=int, default=0, help="0: the model's own (131072)")
    ap.add_argument("--mem-fraction-static", type=float, default=0.6)
    ap.add_argument("--tp", type=int, default=1, help="tp_size of the engine (one scheduler process per rank)")
    dp.add_arguments(ap)
    ap.add_argument("--engine-extra", default="{}", help="JSON object of Engine settings over the rest")
    ap.add_argument(
        "--profile-batch",
        default="0",
        help="BS[,BS...] > 0: after its timed generates, one more under sglang's profiler (profile_run.py)",
    )
    ap.add_argument("--profile-steps", type=int, default=20, help="decode steps --profile-batch profiles")
    ap.add_argument(
        "--serve", action="store_true", help="after start-up, answer duel.py's generate calls (duel_serve.py)"
    )
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    sync_dir = os.environ.get(syncs.ENV_DIR)
    control = os.environ.get(mirror_control.ENV_CONTROL)
    if args.alternate and not control:
        raise SystemExit(f"--alternate needs {mirror_control.ENV_CONTROL} (set by the orchestrator)")
    tree_parent = str(Path(args.tree_parent).resolve())
    if sys.path[0] != tree_parent:
        sys.path.insert(0, tree_parent)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    names = args.workloads.split(",")
    if deepseek.is_deepseek(args.size) != (args.scenario == "mtp"):
        raise SystemExit(f"--size {args.size} --scenario {args.scenario}: DeepSeek sizes run mtp, Llama ones not")
    if args.scenario == "mtp":
        target = draft = deepseek.write_model(Path(args.models_dir), args.size)
    else:
        target, draft = write_models(Path(args.models_dir), args.size, args.draft)
    stamp = None
    if args.draft == "checkpoint" and args.scenario == "eagle3":
        t = time.perf_counter()
        stamp = draft_checkpoint.ensure(draft)
        print(
            f"[runner] draft checkpoint {stamp['sha256'][:16]} ({stamp['bytes'] / 2**20:.0f} MiB) "
            f"ready in {time.perf_counter() - t:.1f} s",
            flush=True,
        )

    target_stamp = None
    if target_weights.wanted():
        if args.scenario == "mtp":
            raise SystemExit(f"{target_weights.ENV}=random: Llama sizes only")
        t = time.perf_counter()
        target_stamp = target_weights.ensure(target)
        print(f"[runner] random target weights ready in {time.perf_counter() - t:.1f} s", flush=True)

    import sglang

    result = {
        "variant": args.variant,
        "size": args.size,
        "scenario": args.scenario,
        "deterministic": args.deterministic,
        "attention_backend": args.attention_backend,
        "piecewise_asked": args.piecewise,
        "draft": args.draft,
        "draft_checkpoint": stamp,
        "target_weights": target_stamp,
        "sglang_file": sglang.__file__,
        "sglang_version": getattr(sglang, "__version__", "?"),
        "patchkit_importable": _patchkit_where(),
        "input_len": args.input_len,
        "max_new_tokens": args.max_new_tokens,
        "tp_size": args.tp,
        "dp_size": args.dp,
        "batches": [],
    }
    from sglang.srt.entrypoints.engine import Engine

    kwargs = engine_kwargs(
        target,
        draft,
        attention_backend=args.attention_backend,
        cuda_graph_max_bs=max(max(batch_sizes), 8),
        mem_fraction_static=args.mem_fraction_static,
        scenario=args.scenario,
        deterministic=args.deterministic,
        tp_size=args.tp,
        piecewise=args.piecewise,
        draft_kind=args.draft,
        context_length=args.context_length,
        engine_extra=json.loads(args.engine_extra),
        scale=dp.engine_kwargs(args),
        target_load_format=target_weights.load_format(),
    )
    # 0.5.17 renamed three settings (server_args_names.py): the names this tree's ServerArgs has
    kwargs, result["engine_kwargs_renamed"] = server_args_names.for_fields(
        kwargs, server_args_names.server_args_fields()
    )
    result["engine_kwargs"] = kwargs
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))  # kept if the engine kills us
    t0 = time.perf_counter()
    try:
        engine = Engine(**kwargs)
    except Exception as exc:  # noqa: BLE001  a refused setting is a result (issue 58), not a crash
        result["engine_failure"] = (f"{type(exc).__name__}: {exc}".splitlines() or ["?"])[0]
        print(engine_facts.FAILURE_PREFIX + result["engine_failure"], flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
        return 3
    result["engine_start_s"] = round(time.perf_counter() - t0, 1)
    print(f"[runner] engine up in {result['engine_start_s']} s", flush=True)
    # Up: every graph captured. What is in force, and what start-up synced (sites.py).
    result["syncs_startup"] = syncs.syncs_only(_settled_table(sync_dir))
    result["ranks_startup"] = ranks.run_per_rank(ranks.read(sync_dir))
    result["engine_facts"] = _facts(sync_dir, args.tp)
    for facts in result["engine_facts"]:
        print(f"[runner] in force: {json.dumps(facts, sort_keys=True)}", flush=True)
    try:
        vocab = deepseek.VOCAB if args.scenario == "mtp" else SIZES[args.size]["vocab_size"]
        if args.serve:  # issue 67: the duel's driver times this engine beside the others
            Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
            duel_serve.serve(engine, result, vocab=vocab, input_len=args.input_len, max_new_tokens=args.max_new_tokens)
            names = []
        for name in names:
            for bs in batch_sizes:
                requests = workloads.build(
                    name, bs, input_len=args.input_len, max_new_tokens=args.max_new_tokens, vocab=vocab, seed=bs
                )
                workloads.generate(engine, requests)  # warm-up
                head = {"batch_size": bs, "workload": name, "output_lens": [r.max_new_tokens for r in requests]}
                if args.alternate:
                    batch = {
                        **head,
                        **alternated_runs(
                            engine,
                            requests,
                            args.alternate,
                            sync_dir,
                            mirror_control.Switch(control or "", schedulers=args.tp),
                        ),
                    }
                    s = batch["summary"]
                    print(
                        f"[runner] {args.variant} {args.size} {name} bs={bs}: kept "
                        f"{s['kept_ms_per_step']:.3f} ms/step, dropped {s['dropped_ms_per_step']:.3f}, "
                        f"ratio {s['ratio'][0]:.4f} [{s['ratio'][1]:.4f}, {s['ratio'][2]:.4f}]",
                        flush=True,
                    )
                else:
                    batch = {**head, **timed_runs(engine, requests, args.runs, sync_dir)}
                    print(
                        f"[runner] {args.variant} {args.size} {name} bs={bs}: {batch['tok_per_s']:.1f} tok/s "
                        f"accept {batch['accept_length']} steps {batch['decode_steps']} "
                        f"syncs {sum(batch['syncs'].values())} tree mask {batch['tree_mask']}",
                        flush=True,
                    )
                result["batches"].append(batch)
                Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
                if (
                    bs in profile_run.batch_sizes(args.profile_batch) and not args.alternate
                ):  # issue 57: the timed ones are written
                    batch["profile"] = profile_run.profiled_generate(
                        engine,
                        workloads.generate,
                        requests,
                        Path(f"{args.out}.profile-{name}-bs{bs}"),
                        profile_run.steps_to_profile(args.profile_steps, batch["decode_steps"], args.runs),
                        label=f"{args.variant} {name} bs={bs}",
                    )
                    print(f"[runner] {batch['profile']['line']}", flush=True)
                    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
        result["syncs_whole_run"] = syncs.syncs_only(_sync_table(sync_dir))
        result["ranks"] = ranks.run_per_rank(ranks.read(sync_dir))
        result["engine_env_seen"] = engine_env.seen(ranks.read(sync_dir), ranks.rank_of)
        late = engine_facts.from_dumps(ranks.read(sync_dir))
        if len(late) > len(result["engine_facts"]):
            result["engine_facts"] = late
    finally:
        result["kernel_gaps"] = kernel_gaps.met(ranks.read(sync_dir))  # 0.5.9's stand-ins: asked, called
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
        engine.shutdown()
    return 0


def _facts(sync_dir: str | None, schedulers: int, limit: float = 5.0) -> list[dict]:
    """Every scheduler's noted facts, waiting (up to ``limit`` s) for each one's next flush."""
    deadline = time.monotonic() + limit
    got = engine_facts.from_dumps(ranks.read(sync_dir))
    while sync_dir and len(got) < schedulers and time.monotonic() < deadline:
        time.sleep(0.1)
        got = engine_facts.from_dumps(ranks.read(sync_dir))
    return got


def _patchkit_where() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("patchkit")
    return spec.origin if spec else None


if __name__ == "__main__":
    sys.exit(main())
