"""Environment variables for the engines of a call (issue 67: the host bound's switches).

``--engine-env KEY=VALUE`` (repeatable) puts ``KEY=VALUE`` in the environment of every
runner the orchestrator starts, so the engine's own processes (the scheduler of each TP
rank, started by sglang from the runner) inherit it: e.g. ``PATCHKIT_CHECK_SEQ_LEN_BOUND=1``
(compare the host-side sequence-length bound with the device value each step and raise if
it is too small) or ``PATCHKIT_SEQ_LEN_BOUND=static`` (the old ``max_context_len`` bound).

That they arrived is checked, not assumed: the orchestrator also sets
``PK_E2E_ENGINE_ENV`` to the keys, and every process the bundle's ``sitecustomize`` starts
the sync recorder in (:func:`note_in_process`, from ``syncs.install``, counters on or off)
notes the values it sees. The runner keeps what every process noted (:func:`seen`, results
``engine_env_seen``) and the orchestrator makes a process that saw another value, or fewer
than the runner and one engine process noting, a PROBLEM (:func:`problems`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ENV_KEYS = "PK_E2E_ENGINE_ENV"
NOTE = "engine_env"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--engine-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for every engine process (repeatable), e.g. "
        "PATCHKIT_CHECK_SEQ_LEN_BOUND=1; each scheduler's value is read back (engine_env.py)",
    )


def parse(items: Iterable[str]) -> dict[str, str]:
    """``["K=V", ...]`` -> ``{"K": "V"}``; a malformed item or key stops the call."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not _KEY.match(key):
            raise SystemExit(f"--engine-env {item!r}: expected KEY=VALUE with KEY a variable name")
        out[key] = value
    return out


def for_runner(asked: Mapping[str, str]) -> dict[str, str]:
    """What the orchestrator adds to a runner's environment: the variables and their keys."""
    return {**asked, ENV_KEYS: ",".join(sorted(asked))} if asked else {}


def note_in_process(note, environ: Mapping[str, str] = os.environ) -> None:
    """Note (``note(key, value)``: syncs.note) the asked variables as this process sees them."""
    keys = [k for k in (environ.get(ENV_KEYS) or "").split(",") if k]
    if keys:
        note(NOTE, {k: environ.get(k) for k in keys})


def seen(dumps: Iterable[Mapping], rank_of) -> dict:
    """What each process that noted saw: ``"rank N"`` for a scheduler that noted its TP rank,
    ``"pid N"`` for the others. With the counters off no rank is noted (the import probes that
    note it are off), so the runner and the engine's children (scheduler, detokenizer) all
    appear by pid: the children are spawned by sglang, so what they saw is what the scheduler saw."""
    out: dict = {}
    for dump in dumps:
        env = (dump.get("notes") or {}).get(NOTE)
        if env is None:
            continue
        rank = rank_of(dump)
        out[f"rank {rank}" if rank is not None else f"pid {dump.get('pid', '?')}"] = env
    return out


def problems(key: str, asked: Mapping[str, str], run: Mapping, least: int = 2) -> list[str]:
    """A process that saw another value than asked, or fewer than ``least`` that noted (the
    runner and at least one process the engine started)."""
    if not asked or not run.get("batches"):
        return []
    got = run.get("engine_env_seen") or {}
    if len(got) < least:
        return [
            f"{key}: {len(got)} process(es) noted their environment, expected the runner and the "
            f"engine's own (--engine-env {sorted(asked)})"
        ]
    return [
        f"{key}: {who} saw {env} for --engine-env {dict(asked)}"
        for who, env in sorted(got.items())
        if env != dict(asked)
    ]


def arrived(runner_json: Path, asked: dict) -> dict:
    """What the engine's processes saw of its variables (the runner's ``engine_env_seen``:
    the runner and each of sglang's processes that noted them; their number is kept) and
    whether every one saw them as asked."""
    seen = json.loads(runner_json.read_text()).get("engine_env_seen") if runner_json.exists() else None
    seen = seen or {}
    ok = bool(seen) and all(v == asked for v in seen.values())
    return {"env": asked, "env_seen": seen, "env_processes": len(seen), "env_ok": ok}
