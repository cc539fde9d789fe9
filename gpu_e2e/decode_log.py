"""GPU side: the decode rate sglang's own scheduler logs, read for one generate (issue 67).

Every ``decode_log_interval`` decode steps (40 by default) a scheduler logs

    [2026-11-28 05:50:01 TP0] Decode batch, #running-req: 128, #token: ..., gen throughput (token/s): 3912.40, ...

with the tokens it made since its last such line over the time since then. A whole
generate's wall time also holds the prompts' admission (requests reach the scheduler in
a timing-dependent number of prefill batches), the prefill and the output's return: the
grids of 2026-11-28 read one tree's eager generate at 1.6 to 3.0 s from round to round.
The logged rate of the steps in between, all at the full batch, leaves those out.

What counts: in the log written during one generate, each scheduler's lines (keyed by the
log prefix, ``TP0``, ``DP1 TP1`` ...) after its first one (that one's interval reaches back
over the time the engine stood frozen before the call), at that scheduler's largest
``#running-req`` in the call (the steady batch; fewer while prompts are still coming in).
Nothing here is timed by the harness: the figures are sglang's.

An engine started with ``SGLANG_LOG_GC=1`` (sglang's own switch: its scheduler logs every
garbage collection, ``GC end: ... | Generation G | Duration: S s``) also gets the call's
collections: how many, and the seconds they took, by generation. A diagnosis for the
spread of host-bound steps (2026-11-28d: a call's logged rate rises as it goes), for an
engine beside the compared ones, never one of them: the logging costs host time itself.
"""

from __future__ import annotations

import os
import re
import statistics
from collections import defaultdict

LINE = re.compile(
    r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?P<who>[^\]]*)\] Decode batch[^,]*, "
    r"#running-req: (?P<running>\d+),.*gen throughput \(token/s\): (?P<rate>[0-9.]+)"
)


GC_END = re.compile(r"GC end: .*\| Generation (?P<gen>\d+) \| Duration: (?P<s>[0-9.]+)s")


def log_path() -> str | None:
    """The file this process's stdout goes to (the duel points stdout and stderr of a runner,
    and so of its schedulers, at ``engine-NAME.log``); None when it is not a plain file."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isfile(path) else None


def size_of(path: str | None) -> int:
    return os.path.getsize(path) if path else 0


def read_from(path: str | None, offset: int) -> str:
    if not path:
        return ""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def steady_rates(text: str) -> list[float]:
    """The logged rates of one generate's steady batch, every scheduler's (see the module doc)."""
    by_who: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            by_who[m["who"].strip()].append((int(m["running"]), float(m["rate"])))
    rates: list[float] = []
    for lines in by_who.values():
        later = lines[1:]
        if later:
            top = max(n for n, _ in later)
            rates.extend(rate for n, rate in later if n == top)
    return rates


def collections(text: str) -> dict:
    """``{"gc": {generation: [count, seconds]}}`` of the GC lines in ``text``, or {} without any."""
    by_gen: dict[str, list] = {}
    for m in GC_END.finditer(text):
        entry = by_gen.setdefault(m["gen"], [0, 0.0])
        entry[0] += 1
        entry[1] = round(entry[1] + float(m["s"]), 4)
    return {"gc": by_gen} if by_gen else {}


def summary(text: str) -> dict:
    """``decode_tok_per_s`` (the median steady rate, None without one), how many lines, and
    the call's garbage collections where the engine logs them."""
    rates = steady_rates(text)
    return {
        "decode_tok_per_s": round(statistics.median(rates), 2) if rates else None,
        "decode_lines": len(rates),
        **collections(text),
    }
