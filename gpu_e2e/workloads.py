"""What a timed generate sends: the requests of one batch, and when they arrive.

Two workloads (issue 23):

* ``uniform``: every request has the same prompt length and ``max_new_tokens``, all
  sent at once, so they all leave the batch at the same step (the first proof's
  traffic);
* ``mixed``: prompt lengths drawn from 16-256 and output lengths from 32-512 per
  request (seeded), half the batch sent at once and the other half in waves while
  the first half decodes: requests leave the batch one by one (``filter_batch``)
  and join it (``merge_batch``), as in real traffic.

* ``penalized`` (issue 53): ``uniform`` with a ``frequency_penalty`` and a
  ``presence_penalty`` on every request, so sglang's penalizers run every decode step
  (their copy of the latest output ids to the device is what is watched). Not
  ``min_new_tokens``: its penalizer reads ``req.tokenizer.additional_stop_token_ids``,
  and with ``skip_tokenizer_init`` (no tokenizer) the scheduler of 0.5.12.post1 dies on
  the first such request (AttributeError, ``min_new_tokens.py:31``), pristine alike
  (seen on the H100, 2026-11-26).

``ignore_eos`` holds in all, so a request's length is exactly its ``max_new_tokens``
and two trees that compute the same tokens do the same number of steps.
Pure functions: unit-tested on CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

WORKLOADS = ("uniform", "mixed", "penalized")
#: The penalized workload's sampling (greedy stays deterministic under a penalty).
PENALTY = 0.5
MIXED_PROMPT_LENS = (16, 256)
MIXED_OUTPUT_LENS = (32, 512)
#: Seconds between the waves of late requests of the mixed workload.
WAVE_GAP_S = 0.05
WAVES = 4


@dataclass(frozen=True)
class Request:
    input_ids: tuple[int, ...]
    max_new_tokens: int
    #: Seconds after the generate call starts (0: with the first batch).
    arrive_s: float = 0.0
    #: 0.0: no penalizer asked for.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


def _prompt(rng: random.Random, length: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, vocab) for _ in range(length))


def uniform(batch_size: int, *, input_len: int, max_new_tokens: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request(_prompt(rng, input_len, vocab), max_new_tokens) for _ in range(batch_size)]


def mixed(batch_size: int, *, vocab: int, seed: int = 0, max_new_tokens: int | None = None) -> list[Request]:
    """Mixed lengths; ``max_new_tokens`` (when given) caps the drawn output lengths so
    that a short in-process measurement keeps the same shape of traffic."""
    rng = random.Random(seed)
    lo, hi = MIXED_OUTPUT_LENS
    if max_new_tokens is not None:
        hi = max(min(hi, max_new_tokens), 2)
        lo = max(min(lo, hi // 4), 1)
    first = (batch_size + 1) // 2
    out = []
    for i in range(batch_size):
        length = rng.randint(*MIXED_PROMPT_LENS)
        wave = 0 if i < first else 1 + (i - first) % WAVES
        out.append(Request(_prompt(rng, length, vocab), rng.randint(lo, hi), wave * WAVE_GAP_S))
    return out


def build(name: str, batch_size: int, *, input_len: int, max_new_tokens: int, vocab: int, seed: int) -> list[Request]:
    if name == "uniform":
        return uniform(batch_size, input_len=input_len, max_new_tokens=max_new_tokens, vocab=vocab, seed=seed)
    if name == "mixed":
        return mixed(batch_size, vocab=vocab, seed=seed, max_new_tokens=max_new_tokens)
    if name == "penalized":
        return [
            replace(r, frequency_penalty=PENALTY, presence_penalty=PENALTY)
            for r in uniform(batch_size, input_len=input_len, max_new_tokens=max_new_tokens, vocab=vocab, seed=seed)
        ]
    raise ValueError(f"unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")


def staggered(requests: list[Request]) -> bool:
    return any(r.arrive_s > 0 for r in requests)


def params(r: Request) -> dict:
    """sglang's sampling parameters of one request (penalties only where asked for)."""
    out = {"temperature": 0.0, "max_new_tokens": r.max_new_tokens, "ignore_eos": True}
    if r.frequency_penalty:
        out["frequency_penalty"] = r.frequency_penalty
    if r.presence_penalty:
        out["presence_penalty"] = r.presence_penalty
    return out


def first_token_only(requests: list[Request]) -> list[Request] | None:
    """The same prompts asking one new token each: a generate that is all prefill (target,
    then draft) and the engine's per-request path, with no decode step. Its time taken from
    a whole generate's leaves the decode steps' (issue 57: tok/s of the decode alone).
    None where that subtraction means nothing: late arrivals or unequal lengths."""
    if staggered(requests) or len({r.max_new_tokens for r in requests}) != 1 or requests[0].max_new_tokens < 2:
        return None
    return [replace(r, max_new_tokens=1) for r in requests]


def generate(engine, requests: list[Request]) -> list[dict]:
    """Send ``requests`` to an ``sglang.Engine``; outputs in request order.

    All at once through ``engine.generate`` when nobody arrives late; otherwise each
    request is its own ``async_generate`` on the engine's event loop, started after
    its delay, so late requests join a batch that is decoding.
    """
    if not staggered(requests):
        if len({tuple(sorted(params(r).items())) for r in requests}) == 1:
            return engine.generate(input_ids=[list(r.input_ids) for r in requests], sampling_params=params(requests[0]))
        return engine.generate(
            input_ids=[list(r.input_ids) for r in requests], sampling_params=[params(r) for r in requests]
        )
    import asyncio

    async def one(r: Request):
        if r.arrive_s:
            await asyncio.sleep(r.arrive_s)
        return await engine.async_generate(input_ids=list(r.input_ids), sampling_params=params(r))

    async def all_of():
        return await asyncio.gather(*(one(r) for r in requests))

    loop = asyncio.get_event_loop()
    return loop.run_until_complete(all_of())
