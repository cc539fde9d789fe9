"""GPU side: the generate calls one engine process times, with the syncs, decode
steps and accept lengths counted around them (plain runs, or ABBA alternations of
mirror kept / dropped in one process).

Kept apart from :mod:`.runner`, which starts the engine and writes the result:
this is what one batch measures, once the engine is up.
"""

from __future__ import annotations

import statistics
import time

from . import mirror_control, ranks, syncs, tree_mask_probe, worker_steps, workloads


def _sync_table(sync_dir: str | None, wait: float = 1.5) -> dict:
    if not sync_dir:
        return {}
    time.sleep(wait)  # let every process's flusher write its last counts
    return syncs.aggregate(syncs.read_dir(sync_dir))


def _settled_table(sync_dir: str | None, period: float = 0.05, limit: float = 3.0) -> dict:
    """The sync table once no process's counts move any more (two reads ``period``
    apart agree): after a generate call the schedulers are idle, so this is that
    call's last count, not one a late flush would carry into the next call."""
    if not sync_dir:
        return {}
    deadline = time.monotonic() + limit
    last = _sync_table(sync_dir, wait=period)
    while time.monotonic() < deadline:
        now = _sync_table(sync_dir, wait=2 * period)
        if now == last:
            return now
        last = now
    return last


def _call(engine, requests) -> dict:
    t = time.perf_counter()
    outs = workloads.generate(engine, requests)
    elapsed = time.perf_counter() - t
    return {
        "elapsed_s": elapsed,
        "completion_tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
        "verify_ct": sum(o["meta_info"].get("spec_verify_ct", 0) or 0 for o in outs),
        "output_ids": [list(o["output_ids"]) for o in outs],
        "accept_per_request": [accept_of(o) for o in outs],
    }


def accept_of(out: dict) -> float | None:
    """Tokens per verify step of one request (None without speculative decoding)."""
    verify = out["meta_info"].get("spec_verify_ct") or 0
    return round(out["meta_info"]["completion_tokens"] / verify, 3) if verify else None


def timed_runs(engine, requests, runs: int, sync_dir: str | None) -> dict:
    """``runs`` identical generate calls: their times, outputs and syncs together."""
    bs = len(requests)
    before = _sync_table(sync_dir)
    before_ranks = ranks.read(sync_dir)
    calls = [_call(engine, requests) for _ in range(runs)]
    timed = syncs.delta(_sync_table(sync_dir), before)
    med = statistics.median(c["elapsed_s"] for c in calls)
    toks = calls[0]["completion_tokens"]
    verify = sum(c["verify_ct"] for c in calls)
    steps, source = decode_steps_of(timed)
    batch = {
        "elapsed_s": [round(c["elapsed_s"], 4) for c in calls],
        "median_s": med,
        "tok_per_s": toks / med,
        "ms_per_token": 1000.0 * med / (toks / bs),
        "accept_length": (sum(c["completion_tokens"] for c in calls) / verify) if verify else None,
        "deterministic": all(c["output_ids"] == calls[0]["output_ids"] for c in calls),
        "output_ids": calls[0]["output_ids"],
        "accept_per_request": calls[0]["accept_per_request"],
        "syncs": syncs.syncs_only(timed),
        "decode_steps": steps,
        "decode_steps_from": source,
        "tree_mask": tree_mask_probe.counts(timed),
        "ranks": ranks.batch_per_rank(ranks.read(sync_dir), before_ranks),
        "verify_ct": verify,
        "sync_debug_armed": armed_in(sync_dir),
    }
    # last: every count above is the timed calls' alone
    return {**batch, **first_token_runs(engine, requests, runs, med, toks)}


def first_token_runs(engine, requests, runs: int, median_s: float, toks: int) -> dict:
    """After the timed calls, ``runs`` calls of the same prompts asking one token each
    (:func:`workloads.first_token_only`), and the decode alone's tok/s: the tokens after the
    first over the median whole call less the median first-token call. Empty where the
    workload has no such call."""
    first = workloads.first_token_only(requests)
    if first is None:
        return {}
    times = [_call(engine, first)["elapsed_s"] for _ in range(runs)]
    first_s = statistics.median(times)
    decode_s = median_s - first_s
    return {
        "first_token_s": [round(t, 4) for t in times],
        "first_token_median_s": first_s,
        "decode_tok_per_s": (toks - len(requests)) / decode_s if decode_s > 0 else None,
    }


def decode_steps_of(timed: dict) -> tuple[int, str | None]:
    """(decode steps, what counted them). Up to 0.5.13 the spec-v2 draft input's
    ``prepare_for_decode`` (syncs.CALL_PROBES); 0.5.17 folded eagle_info_v2 into
    eagle_info and has none, so there its worker's decode calls
    (``EAGLEWorkerV2.forward_batch_generation`` on a decode batch, worker_steps.py)."""
    prepared = syncs.calls_of(timed, "prepare_for_decode")
    if prepared:
        return prepared, "prepare_for_decode"
    worker = worker_steps.steps_of(timed)["decode"]
    return worker, ("worker" if worker else None)


def armed_in(sync_dir: str | None) -> bool:
    """Whether torch's sync debug mode was armed in every scheduler process (host_waits.py)."""
    schedulers = [d for d in ranks.read(sync_dir) if ranks.rank_of(d) is not None]
    return bool(schedulers) and all((d.get("notes") or {}).get("sync_debug_armed") for d in schedulers)


def alternated_runs(engine, requests, pairs: int, sync_dir: str | None, switch: mirror_control.Switch) -> dict:
    """ABBA alternations of mirror kept / dropped in this process (see mirror_control)."""
    order = mirror_control.abba(pairs)
    calls: list[dict] = []
    table = _sync_table(sync_dir)
    for arm in order:
        switch.set(arm)
        call = _call(engine, requests)
        after = _settled_table(sync_dir)
        timed = syncs.delta(after, table)
        table = after
        steps = syncs.calls_of(timed, "prepare_for_decode")
        calls.append(
            {
                "arm": arm,
                "elapsed_s": round(call["elapsed_s"], 5),
                "decode_steps": steps,
                "prepare_syncs": sum(n for k, n in syncs.syncs_only(timed).items() if ":prepare_for_decode:" in k),
                "syncs": sum(syncs.syncs_only(timed).values()),
                "accept_length": call["completion_tokens"] / call["verify_ct"] if call["verify_ct"] else None,
                "same_output": call["output_ids"] == (calls[0]["_out"] if calls else call["output_ids"]),
                "_out": call["output_ids"] if not calls else None,
            }
        )
    for c in calls:
        c.pop("_out")
    switch.set(mirror_control.DROPPED)  # leave the tree's own decision in place
    return {"calls": calls, "summary": mirror_control.summary_of_calls(calls)}
