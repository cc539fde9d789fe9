"""The duel's table (issue 67): per batch size, one tree's speed over another's, round by round.

A round holds one generate of every engine at every batch size, back to back, so the
ratio of two engines' times within a round shares the host's state of that minute.
Each row gives every round's ratio and their median; ``BASE:OTHER`` reads "OTHER's
speed as a multiple of BASE's" (BASE's time over OTHER's: the same tokens were made).
Outputs are compared by digest: every call of both engines at that batch size.

Where the runners read sglang's own decode log (:mod:`.decode_log`, 2026-11-28d on), a row
also carries ``decode``: the same ratios from the rate the scheduler logged over the calls'
steady batch, which leaves out the prompts' admission, the prefill and the return. With the
counters on, :func:`waits` gives each engine's host waits per decode step, site by site.
Read again from ``duel.json`` by the tests that check docs/gpu.md.
"""

from __future__ import annotations

import statistics

from . import wait_report
from .duel_stats import accepts, by_round, calls_of, together, verdict

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
    timed = by_round(calls)
    rows = []
    for bs in sorted({c["batch_size"] for c in calls}):
        for base, other in pairs:
            rounds = sorted(r for (r, b, e) in timed if b == bs and e == base and (r, bs, other) in timed)
            if not rounds:
                continue
            ratios = [timed[(r, bs, base)]["elapsed_s"] / timed[(r, bs, other)]["elapsed_s"] for r in rounds]
            shas = {  # every generate's, repeats included
                c["outputs_sha256"]
                for c in calls
                if "error" not in c and c["batch_size"] == bs and c["engine"] in (base, other) and c["round"] in rounds
            }
            rows.append(
                {
                    **_decode(timed, rounds, bs, base, other),
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


def _decode(timed: dict, rounds: list[int], bs: int, base: str, other: str) -> dict:
    """``{"decode": {...}}`` over the rounds where both engines' logs gave a steady rate, else {}."""
    rate = {(r, e): timed[(r, bs, e)].get("decode_tok_per_s") for r in rounds for e in (base, other)}
    both = [r for r in rounds if rate[(r, base)] and rate[(r, other)]]
    if not both:
        return {}
    ratios = [rate[(r, other)] / rate[(r, base)] for r in both]
    return {
        "decode": {
            "rounds": len(both),
            "ratios": [round(x, 4) for x in ratios],
            "median": round(statistics.median(ratios), 4),
            "min": round(min(ratios), 4),
            "max": round(max(ratios), 4),
            "tok_per_s": {e: round(statistics.median(rate[(r, e)] for r in both), 1) for e in (base, other)},
        }
    }


def waits(calls: list[dict]) -> list[dict]:
    """Host waits per decode step by torch's count (:func:`wait_report.blocking_sites`: sync
    and non-blocking-from-pageable copies, by function), per engine and batch size, over
    every counted call (the counters on): the total, and the sites in falling order."""
    by: dict[tuple[str, int], list[dict]] = {}
    for c in calls:
        if "error" not in c and c.get("decode_steps") is not None:
            by.setdefault((c["engine"], c["batch_size"]), []).append(c)
    rows = []
    for (engine, bs), got in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        steps = sum(c["decode_steps"] for c in got)
        table: dict[str, int] = {}
        for c in got:
            for key, n in (c.get("syncs") or {}).items():
                table[key] = table.get(key, 0) + n
        sites = {site.removeprefix(wait_report.PREFIX): n for site, n in wait_report.blocking_sites(table).items()}
        rows.append(
            {
                "engine": engine,
                "batch_size": bs,
                "calls": len(got),
                "decode_steps": steps,
                "waits": sum(sites.values()),
                "per_step": round(sum(sites.values()) / steps, 3) if steps else None,
                "sites": dict(sorted(sites.items(), key=lambda kv: (-kv[1], kv[0]))),
            }
        )
    return rows


def collections(calls: list[dict]) -> list[dict]:
    """Per engine logging its garbage collections (SGLANG_LOG_GC) and batch size: each call's
    seconds in GC and its generation-2 collections, beside the call's logged decode rate."""
    by: dict[tuple[str, int], list[dict]] = {}
    for c in calls:
        if "gc" in c:
            by.setdefault((c["engine"], c["batch_size"]), []).append(c)
    return [
        {
            "engine": engine,
            "batch_size": bs,
            "gc_s": [round(sum(s for _, s in c["gc"].values()), 4) for c in got],
            "gen2": [c["gc"].get("2", [0, 0.0])[0] for c in got],
            "decode_tok_per_s": [c.get("decode_tok_per_s") for c in got],
        }
        for (engine, bs), got in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def host(calls: list[dict]) -> list[dict]:
    """Per engine and batch size, round by round (host_usage.py: what /proc says of each
    call): the engine's own CPU milliseconds a token, the share of the host's CPU time stolen
    by the hypervisor, and the wall rate, so a slow round can be read against both."""
    by: dict[tuple[str, int], dict[int, list[dict]]] = {}
    for c in calls:
        if "host" in c and "error" not in c:
            by.setdefault((c["engine"], c["batch_size"]), {}).setdefault(c["round"], []).append(c)
    rows = []
    for (engine, bs), rounds in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cpu_ms, steal, rate = [], [], []
        for got in rounds.values():
            tokens = sum(c["completion_tokens"] for c in got)
            h = {
                k: sum(c["host"][k] for c in got)
                for k in ("host_busy_s", "host_idle_s", "host_steal_s", "engine_cpu_s")
            }
            total = h["host_busy_s"] + h["host_idle_s"] + h["host_steal_s"]
            cpu_ms.append(round(1000 * h["engine_cpu_s"] / tokens, 3))
            steal.append(round(h["host_steal_s"] / total, 4) if total else 0.0)
            rate.append(round(tokens / sum(c["elapsed_s"] for c in got), 1))
        processes = max(c["host"].get("engine_processes", 0) for got in rounds.values() for c in got)
        rows.append(
            {
                "engine": engine,
                "batch_size": bs,
                "processes": processes,
                "cpu_ms_per_token": cpu_ms,
                "steal": steal,
                "tok_per_s": rate,
            }
        )
    return rows


def instructions(calls: list[dict]) -> list[dict]:
    """Per engine and batch size, round by round: the instructions its threads retired in user
    space a token, in millions (host_counters.py; only where the host counts them). Unlike wall
    time and CPU seconds, the count does not move with the core's speed."""
    by: dict[tuple[str, int], list[float]] = {}
    for c in calls:
        if "error" not in c and "engine_instructions" in c.get("host", {}):
            per_token = c["host"]["engine_instructions"] / c["completion_tokens"] / 1e6
            by.setdefault((c["engine"], c["batch_size"]), []).append(round(per_token, 4))
    return [
        {"engine": e, "batch_size": bs, "median": round(statistics.median(v), 4), "rounds": v}
        for (e, bs), v in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def ran_with(result: dict) -> list[dict]:
    """What each engine that noted its facts (the counted ones) ran with, read back from its
    own schedulers: the attention backend, whether the draft extend has a CUDA-graph runner
    (issue 72: only the patched DSA tree should), and each rank's mirror decision."""
    rows = []
    for name, engine in sorted((result.get("engines") or {}).items()):
        ready = engine.get("ready") or {}
        facts = ready.get("engine_facts") or []
        if not facts:
            continue
        decisions = [d for r in ready.get("ranks_startup") or [] for d in r.get("decisions") or []]
        rows.append(
            {
                "engine": name,
                "schedulers": len(facts),
                "attn_backend": sorted({str(f.get("attn_backend")) for f in facts}),
                "draft_extend_graph_runner": sorted({str(f.get("draft_extend_graph_runner")) for f in facts}),
                "needs_cpu_seq_lens": decisions,
            }
        )
    return rows


def _tok_per_s(timed: dict, rounds: list[int], bs: int, engine: str) -> float:
    """The median call's tokens per second."""
    return statistics.median(
        timed[(r, bs, engine)]["completion_tokens"] / timed[(r, bs, engine)]["elapsed_s"] for r in rounds
    )


def _section(title: str, header: str, rule: str, rows: list[str]) -> list[str]:
    """One titled table of duel.md, or nothing where it has no row."""
    return ["", title, "", header, rule, *rows] if rows else []


def markdown(result: dict) -> str:
    rows = result.get("summary") or []
    head = [
        f"device: {result.get('device', '?')}",
        "",
        "| bs | graph | pair (OTHER over BASE) | rounds | median | min | max | tok/s BASE → OTHER | outputs "
        "| >= 0.98 (duel_stats.verdict) |",
        "|---:|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    lines = [
        f"| {r['batch_size']} | {'eager' if r['eager'] else 'captured'} | {r['pair']} | {r['rounds']} "
        f"| {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} "
        f"| {' → '.join(f'{v:.0f}' for v in r['tok_per_s'].values())} "
        f"| {'identical' if r['identical'] else 'differ'} | {verdict(r['ratios'])} |"
        for r in rows
    ]
    decode_rows = [
        f"| {r['batch_size']} | {'eager' if r['eager'] else 'captured'} | {r['pair']} | {d['rounds']} "
        f"| {d['median']:.3f} | {d['min']:.3f} | {d['max']:.3f} "
        f"| {' → '.join(f'{v:.0f}' for v in d['tok_per_s'].values())} |"
        for r in rows
        if (d := r.get("decode"))
    ]
    calls = result.get("calls") or []
    decode = _section(
        "decode only (sglang's logged rate over the steady batch):",
        "| bs | graph | pair (OTHER over BASE) | rounds | median | min | max | tok/s BASE → OTHER |",
        "|---:|---|---|---:|---:|---:|---:|---|",
        decode_rows,
    )
    # each pair's correlation once, for the rows of both its engines
    corr = {
        (bs, b, o): together(result, b, o, bs) for bs, b, o in {(r["batch_size"], *r["pair"].split(":")) for r in rows}
    }
    by_engine = _section(
        "each engine's calls (wall time of its rounds; together: the call times' correlation with "
        "each pair's other engine, round by round: duel_stats.together):",
        "| bs | engine | rounds | fastest s | median s | slowest s | together |",
        "|---:|---|---:|---:|---:|---:|---|",
        [
            f"| {c['batch_size']} | {c['engine']} | {c['rounds']} | {c['fastest_s']:.3f} | {c['median_s']:.3f} "
            f"| {c['slowest_s']:.3f} | "
            + ", ".join(
                f"{b if o == c['engine'] else o} {value}"
                for (bs, b, o), value in sorted(corr.items())
                if bs == c["batch_size"] and c["engine"] in (b, o)
            )
            + " |"
            for c in calls_of(result)
        ],
    )
    accepted = _section(
        "accept length a call (completion tokens over verify steps), per engine:",
        "| bs | engine | calls | median | min | max |",
        "|---:|---|---:|---:|---:|---:|",
        [
            f"| {a['batch_size']} | {a['engine']} | {a['calls']} | {a['median']:.3f} | {a['min']:.3f} | {a['max']:.3f} |"
            for a in accepts(calls)
        ],
    )
    counted = _section(
        "host waits per decode step (counters on):",
        "| engine | bs | steps | waits | per step | sites |",
        "|---|---:|---:|---:|---:|---|",
        [
            f"| {w['engine']} | {w['batch_size']} | {w['decode_steps']} | {w['waits']} "
            f"| {w['per_step'] if w['per_step'] is not None else 'n/a'} "
            f"| {'; '.join(f'{k} {v}' for k, v in list(w['sites'].items())[:4]) or '-'} |"
            for w in waits(calls)
        ],
    )
    gc = _section(
        "garbage collection a call (SGLANG_LOG_GC engines), round by round:",
        "| engine | bs | seconds in GC | gen-2 collections | decode tok/s |",
        "|---|---:|---|---|---|",
        [
            f"| {g['engine']} | {g['batch_size']} | {', '.join(f'{x:.3f}' for x in g['gc_s'])} "
            f"| {', '.join(map(str, g['gen2']))} "
            f"| {', '.join(f'{x:.0f}' if x else '-' for x in g['decode_tok_per_s'])} |"
            for g in collections(calls)
        ],
    )
    host_lines = _section(
        "the host a call (/proc), round by round: the engine's CPU ms a token (over its processes), steal share, tok/s:",
        "| engine | bs | processes | CPU ms a token | steal | tok/s |",
        "|---|---:|---:|---|---|---|",
        [
            f"| {h['engine']} | {h['batch_size']} | {h['processes']} "
            f"| {', '.join(f'{x:.3f}' for x in h['cpu_ms_per_token'])} "
            f"| {', '.join(f'{x:.1%}' for x in h['steal'])} | {', '.join(f'{x:.0f}' for x in h['tok_per_s'])} |"
            for h in host(calls)
        ],
    )
    retired = _section(
        "instructions retired a token, in millions (user space, every thread of the engine: host_counters.py):",
        "| engine | bs | median | round by round |",
        "|---|---:|---:|---|",
        [
            f"| {i['engine']} | {i['batch_size']} | {i['median']:.4f} | {', '.join(f'{x:.4f}' for x in i['rounds'])} |"
            for i in instructions(calls)
        ],
    )
    facts = _section(
        "what the counted engines ran with (their schedulers' own facts):",
        "| engine | schedulers | attention backend | draft-extend graph runner | needs_cpu_seq_lens by rank |",
        "|---|---:|---|---|---|",
        [
            f"| {f['engine']} | {f['schedulers']} | {', '.join(f['attn_backend'])} "
            f"| {', '.join(f['draft_extend_graph_runner'])} | {f['needs_cpu_seq_lens'] or '-'} |"
            for f in ran_with(result)
        ],
    )
    engines = (result.get("engines") or {}).items()
    failed = [f"- {n}: {e['failure']}" for n, e in engines if e.get("failure")]
    pinned = [
        f"- {n}: held to CPUs {e['pinned']['cpus']} ({e['pinned']['threads']} threads)"
        for n, e in engines
        if e.get("pinned")
    ]
    notes = [""] + pinned + failed if pinned or failed else []
    return (
        "\n".join(head + lines + decode + by_engine + accepted + counted + gc + host_lines + retired + facts + notes)
        + "\n"
    )


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


def grid_lines(
    results: dict[str, dict], pairs: tuple[str, ...] = ("pristine:patched", "upstream:patched")
) -> list[str]:
    """One markdown row per duel (by its name) and batch size: each pair's median over the
    rounds by wall time and by sglang's logged decode rate (``wall / decode``), the rounds,
    and whether every output was identical. docs/gpu.md's grid, read again by its test."""
    out = []
    for name, result in results.items():
        rows = {(r["batch_size"], r["pair"]): r for r in result.get("summary") or []}
        for bs in sorted({b for b, _ in rows}):
            got = [rows.get((bs, p)) for p in pairs]
            cells = [f"{r['median']:.3f} / {r['decode']['median']:.3f}" if r and r.get("decode") else "—" for r in got]
            live = [r for r in got if r]
            same = all(r["identical"] for r in live)
            eager = "eager" if live and live[0]["eager"] else "captured"
            out.append(
                f"| {name} | {bs} | {eager} | {' | '.join(cells)} | {min(r['rounds'] for r in live)} "
                f"| {'identical' if same else 'differ'} |"
            )
    return out
