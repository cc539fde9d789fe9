"""Host waits by torch's count, per decode step and per site, pristine against patched (issue 53).

A batch's ``syncs`` table (runner.py) holds both counters' entries, ``kind|path:function:line``.
This module reads the ones of torch's counter (:mod:`.host_waits`: ``sync``, ``h2d``,
``h2d-nb``), groups them by function (lines move when a tree is patched; the lines are
kept beside), and counts a site's host waits as ``sync + h2d-nb``
(:func:`host_waits.blocking_count`). The wrapper counter's entries stay in the old table
(report.py) as the cross-check; its per-step total is repeated here.

What fails (:func:`problems`): a site that blocks in the patched engine after start-up
and never in the pristine engine (by function, whole run), and a site that blocks more
often per decode step patched than pristine in the same batch. A site in both is listed
with its count. Pure functions: tested on CPU from synthetic tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .host_waits import KINDS, blocking_count
from .sites import split_by_rate
from .syncs import delta, site_function, split_key, wrapper_only

#: Dropped from the site names in the tables (every sglang site starts so).
PREFIX = "sglang/srt/"


def armed(*batches: Mapping) -> bool:
    """Batches measured since issue 53 carry torch's count (the runner notes it armed)."""
    return all(b.get("sync_debug_armed") for b in batches)


def sites(table: Mapping[str, int]) -> dict[str, dict]:
    """``{"path:function": {"kinds": {kind: n}, "lines": [int], "blocking": n}}`` of the
    host-wait kinds in ``table``."""
    out: dict[str, dict] = {}
    for key, n in table.items():
        kind, site = split_key(key)
        if kind not in KINDS or not n:
            continue
        entry = out.setdefault(site_function(site), {"kinds": {}, "lines": set()})
        entry["kinds"][kind] = entry["kinds"].get(kind, 0) + int(n)
        line = site.rsplit(":", 1)[-1]
        if line.isdigit():
            entry["lines"].add(int(line))
    for entry in out.values():
        entry["lines"] = sorted(entry["lines"])
        entry["blocking"] = blocking_count(entry["kinds"])
    return out


def blocking_sites(table: Mapping[str, int]) -> dict[str, int]:
    """Sites (by function) where the host waited at least once, with the count."""
    return {s: e["blocking"] for s, e in sites(table).items() if e["blocking"]}


def _per(n: Optional[float], steps: int) -> Optional[float]:
    return None if n is None or not steps else n / steps


def compare_batch(pristine: Mapping, patched: Mapping) -> dict:
    """Per decode step, per site: pristine and patched host waits of one batch."""
    sa, sb = sites(pristine["syncs"]), sites(patched["syncs"])
    steps = (pristine["decode_steps"], patched["decode_steps"])
    per_site: dict[str, dict[str, Any]] = {}
    for name in sorted(set(sa) | set(sb)):
        a, b = sa.get(name), sb.get(name)
        per_site[name] = {
            "per_step": (_per(a["blocking"], steps[0]) if a else 0.0, _per(b["blocking"], steps[1]) if b else 0.0),
            "count": (a["blocking"] if a else 0, b["blocking"] if b else 0),
            "lines": (a["lines"] if a else [], b["lines"] if b else []),
            "kinds": (a["kinds"] if a else {}, b["kinds"] if b else {}),
        }
    totals = tuple(sum(e["blocking"] for e in s.values()) for s in (sa, sb))
    wrapper = tuple(sum(wrapper_only(x["syncs"]).values()) for x in (pristine, patched))
    return {
        "decode_steps": steps,
        "per_step": (_per(totals[0], steps[0]), _per(totals[1], steps[1])),
        "sites": per_site,
        **dict(
            zip(
                ("new", "new_negligible"),
                split_by_rate(
                    (n for n, e in per_site.items() if e["count"][1] and not e["count"][0]),
                    {n: e["count"][1] for n, e in per_site.items()},
                    steps[1],
                ),
            )
        ),
        "more": sorted(
            n
            for n, e in per_site.items()
            if e["count"][1] and e["count"][0] and e["per_step"][1] > e["per_step"][0] + 0.01
        ),
        "wrapper_per_step": (_per(wrapper[0], steps[0]), _per(wrapper[1], steps[1])),
    }


def new_sites(
    whole_pristine: Mapping[str, int], whole_patched: Mapping[str, int], startup_patched: Optional[Mapping[str, int]]
) -> tuple[list[str], list[str]]:
    """(sites blocking in patched after start-up, never in pristine; those new at start-up only)."""
    new = set(blocking_sites(whole_patched)) - set(blocking_sites(whole_pristine))
    after = blocking_sites(delta(whole_patched, startup_patched or {}))
    return sorted(s for s in new if after.get(s)), sorted(s for s in new if not after.get(s))


def problems(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        w = r.get("waits")
        if not w:
            continue
        tag = f"{r['release']} {r['size']} {r.get('workload', 'uniform')} bs={r['batch_size']}"
        if w["new"]:
            out.append(f"{tag}: host waits at sites pristine never waits at: {', '.join(w['new'])}")
        if w["more"]:
            out.append(f"{tag}: more host waits per step than pristine at: {', '.join(w['more'])}")
    seen = set()
    for r in rows:
        for site in r.get("new_wait_sites_whole_run") or []:
            if (r["release"], r["size"], site) not in seen:
                seen.add((r["release"], r["size"], site))
                out.append(
                    f"{r['release']} {r['size']}: host waits after start-up at a site pristine never waits at: {site}"
                )
    return out


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _short(site: str) -> str:
    return site[len(PREFIX) :] if site.startswith(PREFIX) else site


def _kinds(kinds: Mapping[str, int], steps: int) -> str:
    return ", ".join(f"{k} {_f(_per(n, steps))}" for k, n in sorted(kinds.items()))


def site_cell(w: Mapping) -> str:
    """Every site of one row: ``path:function`` lines, per step before → after, kinds."""
    if not w["sites"]:
        return "none"
    parts = []
    for name, e in w["sites"].items():
        (pa, pb), (la, lb), (ka, kb) = e["per_step"], e["lines"], e["kinds"]
        lines = (
            ",".join(map(str, la)) if la == lb else f"{','.join(map(str, la)) or '–'} → {','.join(map(str, lb)) or '–'}"
        )
        flag = " **new**" if name in w["new"] else (" **more**" if name in w["more"] else "")
        kinds = f"{_kinds(ka, w['decode_steps'][0]) or '–'} → {_kinds(kb, w['decode_steps'][1]) or '–'}"
        parts.append(f"`{_short(name)}` ({lines}) {_f(pa)} → {_f(pb)}{flag} [{kinds}]")
    return "<br>".join(parts)


HEADER = (
    "| release | model | workload | bs | decode steps before / after | host waits per step before → after "
    "| sites: lines, per step before → after [kinds per step] | new after start-up "
    "| wrapper counter per step before → after | identical outputs |"
)
RULE = "|---|---|---|---:|---|---|---|---|---|---|"


def markdown(rows: list[dict]) -> str:
    """The host-wait table of every row that carries one (rows before issue 53 do not)."""
    lines = [
        "Host waits by torch's count (sync debug mode + pageable copies; a site's count is sync + h2d-nb):",
        "",
        HEADER,
        RULE,
    ]
    for r in rows:
        w = r.get("waits")
        if not w:
            continue
        (pa, pb), (sa, sb), (xa, xb) = w["per_step"], w["decode_steps"], w["wrapper_per_step"]
        lines.append(
            f"| {r['release']} | {r['size']} | {r.get('workload', 'uniform')} | {r['batch_size']} | {sa} / {sb} "
            f"| {_f(pa)} → {_f(pb)} | {site_cell(w)} | {', '.join(map(_short, r.get('new_wait_sites_whole_run') or [])) or 'none'} "
            f"| {_f(xa)} → {_f(xb)} | {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
