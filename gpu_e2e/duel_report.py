"""The duel's table (issue 67): per batch size, one tree's speed over another's, round by round.

A round holds one generate of every engine at every batch size, back to back, so the
ratio of two engines' times within a round shares the host's state of that minute.
Each row gives every round's ratio and their median; ``BASE:OTHER`` reads "OTHER's
speed as a multiple of BASE's" (BASE's time over OTHER's: the same tokens were made).
Outputs are compared by digest: every call of both engines at that batch size.
Read again from ``duel.json`` by the tests that check docs/gpu.md.
"""

from __future__ import annotations

import statistics

#: patched against pristine (the issue's bar, 0.98), against upstream 0.5.17 (1.0 in eager
#: cells), and against a second engine of its own tree: the measure's noise floor.
DEFAULT_PAIRS = ("pristine:patched", "upstream:patched", "patched:patched-again")


def pairs_of(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        base, sep, other = item.partition(":")
        if not sep or not base or not other:
            raise SystemExit(f"--compare {item!r}: expected BASE:OTHER")
        pairs.append((base, other))
    return pairs


def summary(calls: list[dict], pairs: list[tuple[str, str]], eager_above: int) -> list[dict]:
    """One row per (batch size, pair) with both engines timed in at least one round."""
    timed = {(c["round"], c["batch_size"], c["engine"]): c for c in calls if "error" not in c}
    rows = []
    for bs in sorted({c["batch_size"] for c in calls}):
        for base, other in pairs:
            rounds = sorted(r for (r, b, e) in timed if b == bs and e == base and (r, bs, other) in timed)
            if not rounds:
                continue
            ratios = [timed[(r, bs, base)]["elapsed_s"] / timed[(r, bs, other)]["elapsed_s"] for r in rounds]
            shas = {timed[(r, bs, e)]["outputs_sha256"] for r in rounds for e in (base, other)}
            rows.append(
                {
                    "batch_size": bs,
                    "eager": bs > eager_above,
                    "pair": f"{base}:{other}",
                    "rounds": len(rounds),
                    "ratios": [round(x, 4) for x in ratios],
                    "median": round(statistics.median(ratios), 4),
                    "min": round(min(ratios), 4),
                    "max": round(max(ratios), 4),
                    "tok_per_s": {e: round(_tok_per_s(timed, rounds, bs, e), 1) for e in (base, other)},
                    "identical": len(shas) == 1,
                }
            )
    return rows


def _tok_per_s(timed: dict, rounds: list[int], bs: int, engine: str) -> float:
    """The median call's tokens per second."""
    return statistics.median(
        timed[(r, bs, engine)]["completion_tokens"] / timed[(r, bs, engine)]["elapsed_s"] for r in rounds
    )


def markdown(result: dict) -> str:
    rows = result.get("summary") or []
    head = [
        f"device: {result.get('device', '?')}",
        "",
        "| bs | graph | pair (OTHER over BASE) | rounds | median | min | max | tok/s BASE → OTHER | outputs |",
        "|---:|---|---|---:|---:|---:|---:|---|---|",
    ]
    lines = [
        f"| {r['batch_size']} | {'eager' if r['eager'] else 'captured'} | {r['pair']} | {r['rounds']} "
        f"| {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} "
        f"| {' → '.join(f'{v:.0f}' for v in r['tok_per_s'].values())} "
        f"| {'identical' if r['identical'] else 'differ'} |"
        for r in rows
    ]
    failed = [f"- {n}: {e['failure']}" for n, e in (result.get("engines") or {}).items() if e.get("failure")]
    return "\n".join(head + lines + ([""] + failed if failed else [])) + "\n"


def pooled(results: list[dict], pair: str) -> list[dict]:
    """One pair's per-round ratios pooled over several duels of the same trees and settings
    (one per GPU): per batch size, every round's ratio, their median and how many reach 1."""
    by_bs: dict[int, list[float]] = {}
    for result in results:
        for row in result.get("summary") or []:
            if row["pair"] == pair:
                by_bs.setdefault(row["batch_size"], []).extend(row["ratios"])
    return [
        {
            "batch_size": bs,
            "rounds": len(ratios),
            "median": round(statistics.median(ratios), 3),
            "at_least_1": sum(r >= 1 for r in ratios),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        }
        for bs, ratios in sorted(by_bs.items())
    ]
