"""GPU side, in the runner: serve generate calls to :mod:`.duel`'s driver (issue 67).

A runner started with ``--serve`` brings its engine up as usual, then listens on
``PK_E2E_DUEL_ADDR`` (a Unix socket; the driver's key in ``PK_E2E_DUEL_KEY``): the
socket appearing tells the driver that this engine is up. The driver connects and
sends one message at a time:

* ``{"op": "generate", "workload": W, "batch_size": B}``: one generate of that batch
  (the same prompts every time: the workload's seed is the batch size, as in the
  plain runs), answered with its time, tokens, accept length and a digest of the
  outputs (``outputs_sha256``: compared across trees by the driver), the decode rate
  sglang's scheduler logged meanwhile (:mod:`.decode_log`) and, with the counters on,
  the call's host waits by site and its decode steps (as the plain runs count them);
* ``{"op": "stop"}``: the runner shuts its engine down and exits.

The driver freezes the engines it is not timing (SIGSTOP on the runner's process
group), so between messages this process and its schedulers may stand still.
"""

from __future__ import annotations

import hashlib
import json
import os
import traceback
from multiprocessing.connection import Listener

from . import decode_log, syncs, workloads
from .timed_calls import _call, _settled_table, decode_steps_of

ENV_ADDR = "PK_E2E_DUEL_ADDR"
ENV_KEY = "PK_E2E_DUEL_KEY"


def outputs_sha256(output_ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(output_ids, separators=(",", ":")).encode()).hexdigest()


def answer(engine, message: dict, *, vocab: int, input_len: int, max_new_tokens: int) -> dict:
    """One generate as the driver asked it: what the driver records of it."""
    bs = int(message["batch_size"])
    requests = workloads.build(
        message.get("workload", "uniform"), bs, input_len=input_len, max_new_tokens=max_new_tokens, vocab=vocab, seed=bs
    )
    log = decode_log.log_path()
    offset = decode_log.size_of(log)
    sync_dir = os.environ.get(syncs.ENV_DIR) if not os.environ.get(syncs.ENV_COUNTERS_OFF) else None
    before = _settled_table(sync_dir)
    call = _call(engine, requests)
    counted = {}
    if sync_dir:
        timed = syncs.delta(_settled_table(sync_dir), before)
        counted = {"syncs": syncs.syncs_only(timed), "decode_steps": decode_steps_of(timed)[0]}
    return {
        **decode_log.summary(decode_log.read_from(log, offset)),
        **counted,
        "elapsed_s": round(call["elapsed_s"], 5),
        "completion_tokens": call["completion_tokens"],
        "verify_ct": call["verify_ct"],
        "accept_length": round(call["completion_tokens"] / call["verify_ct"], 4) if call["verify_ct"] else None,
        "outputs_sha256": outputs_sha256(call["output_ids"]),
    }


def serve(engine, ready: dict, *, vocab: int, input_len: int, max_new_tokens: int) -> None:
    """Listen, say ``ready`` (what the runner knows of its engine) to the driver, then
    answer until told to stop."""
    with Listener(os.environ[ENV_ADDR], family="AF_UNIX", authkey=bytes.fromhex(os.environ[ENV_KEY])) as listener:
        with listener.accept() as conn:
            conn.send({"ready": ready, "pid": os.getpid()})
            while True:
                message = conn.recv()
                if message.get("op") == "stop":
                    return
                try:
                    got = answer(engine, message, vocab=vocab, input_len=input_len, max_new_tokens=max_new_tokens)
                except Exception as exc:  # noqa: BLE001  the driver records it and leaves this engine out
                    traceback.print_exc()
                    got = {"error": (f"{type(exc).__name__}: {exc}".splitlines() or ["?"])[0]}
                conn.send(got)
