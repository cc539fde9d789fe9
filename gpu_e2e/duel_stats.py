"""How far a duel's figures can be trusted (issue 67): each engine's own spread over the rounds,
and whether a pair's median is shown above a bar, from the rounds alone.

The ninth run (2026-11-28i) found an eager engine alone on its host moving 1.16-1.59x from
round to round, so a median of three rounds says little about a 0.98 bar. :func:`verdict`
answers "above", "below" or "open" from a distribution-free interval of the median
(:func:`median_interval`), so a cell that the rounds cannot decide is not read as either.
"""

from __future__ import annotations

import math
import statistics


def by_round(calls: list[dict]) -> dict[tuple[int, int, str], dict]:
    """Each (round, batch size, engine)'s generate; a burst of repeats (``--repeats``) as one
    with the median time and logged rate of its generates, so one slow generate does not
    decide the round."""
    by: dict[tuple[int, int, str], list[dict]] = {}
    for c in calls:
        if "error" not in c:
            by.setdefault((c["round"], c["batch_size"], c["engine"]), []).append(c)
    timed = {}
    for key, got in by.items():
        rates = [c["decode_tok_per_s"] for c in got if c.get("decode_tok_per_s")]
        timed[key] = (
            got[0]
            if len(got) == 1
            else {
                **got[0],
                "elapsed_s": statistics.median(c["elapsed_s"] for c in got),
                "decode_tok_per_s": statistics.median(rates) if rates else None,
            }
        )
    return timed


def spread(result: dict) -> list[dict]:
    """Each engine's own wall rate over the rounds, per batch size: its lowest, its highest
    and their quotient. A tree timed against itself moves this much from round to round, so
    a pair's median ratio is read against it (2026-11-28i: one engine alone on its host)."""
    timed = by_round(result.get("calls") or [])
    by: dict[tuple[str, int], list[float]] = {}
    for (_, bs, engine), c in sorted(timed.items()):
        by.setdefault((engine, bs), []).append(c["completion_tokens"] / c["elapsed_s"])
    return [
        {
            "engine": engine,
            "batch_size": bs,
            "rounds": len(rates),
            "min": round(min(rates), 1),
            "max": round(max(rates), 1),
            "max_over_min": round(max(rates) / min(rates), 3),
        }
        for (engine, bs), rates in sorted(by.items())
    ]


def median_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of ``ratios`` (one per round):
    order statistics k and n - k + 1, k the largest with P(Binomial(n, 1/2) < k) <= (1 - c) / 2.
    None below the rounds such an interval needs (6 at 95%)."""
    n, tail = len(ratios), (1 - confidence) / 2
    k, below = 0, 0.0
    while k < n and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    xs = sorted(ratios)
    return xs[k - 1], xs[n - k]


def verdict(ratios: list[float], bar: float = 0.98, confidence: float = 0.95) -> str:
    """Whether a cell is shown at or above ``bar``: "above" when the median's whole interval
    is, "below" when the whole interval is under it, else "open" (these rounds cannot tell;
    the ninth run's eager cells moved 16-59% a round, so a few rounds seldom can)."""
    got = median_interval(ratios, confidence)
    if got is None:
        return "open"
    low, high = got
    return "above" if low >= bar else "below" if high < bar else "open"


def calls_of(result: dict) -> list[dict]:
    """Each engine's calls per batch size, read by engine: the fastest, median and slowest wall
    time of its rounds. The tenth run (2026-11-29, FA3 8B eager bs 128) read 0.86 for patched
    against pristine over 37 rounds while patched's fastest call equalled pristine's (1.69
    against 1.70 s): what differed was how often a call ran slow, which a pair's median hides."""
    timed = by_round(result.get("calls") or [])
    by: dict[tuple[str, int], list[float]] = {}
    for (_, bs, engine), c in sorted(timed.items()):
        by.setdefault((engine, bs), []).append(c["elapsed_s"])
    return [
        {
            "engine": engine,
            "batch_size": bs,
            "rounds": len(times),
            "fastest_s": round(min(times), 3),
            "median_s": round(statistics.median(times), 3),
            "slowest_s": round(max(times), 3),
        }
        for (engine, bs), times in sorted(by.items())
    ]


def together(result: dict, base: str, other: str, batch_size: int) -> float | None:
    """How two engines' call times move together round by round: the correlation of their wall
    times over the rounds both were timed in (None under 3 such rounds, or a constant one).
    Near 1, a slow round is the machine's and the pair's ratio cancels it; near 0, each
    engine's calls are slow on their own (the tenth run: 0.24 for pristine and patched), and
    a pair's ratio carries each engine's own luck, which rounds average only slowly."""
    timed = by_round(result.get("calls") or [])
    rounds = sorted(r for (r, bs, e) in timed if bs == batch_size and e == base and (r, bs, other) in timed)
    if len(rounds) < 3:
        return None
    a = [timed[(r, batch_size, base)]["elapsed_s"] for r in rounds]
    b = [timed[(r, batch_size, other)]["elapsed_s"] for r in rounds]
    try:
        return round(statistics.correlation(a, b), 3)
    except statistics.StatisticsError:  # one engine's times all equal
        return None


def accepts(calls: list[dict]) -> list[dict]:
    """Each engine's accept length (completion tokens over verify steps, duel_serve.py) per
    batch size, over the calls that have one: its median and range. A draft-side patch moves
    it where the speed alone would not say why (the fourteenth run's STANDALONE duel)."""
    by: dict[tuple[int, str], list[float]] = {}
    for c in calls:
        if c.get("accept_length") is not None:
            by.setdefault((c["batch_size"], c["engine"]), []).append(c["accept_length"])
    return [
        {
            "batch_size": bs,
            "engine": engine,
            "calls": len(got),
            "median": statistics.median(got),
            "min": min(got),
            "max": max(got),
        }
        for (bs, engine), got in sorted(by.items())
    ]
