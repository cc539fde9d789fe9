"""Sync sites by function, and which sites a patched engine adds, before and after start-up.

A patch may add a CUDA graph (``fa3-draft-extend-graph`` captures FA3's draft extend),
and capturing one syncs at sites the pristine engine never reaches: that is start-up
work, paid once. What the proof forbids is a new site while serving. So the runner
reads the sync table once the engine is up (``Engine(...)`` returned: weights loaded,
every graph captured) as ``syncs_startup`` beside the whole run's ``syncs_whole_run``,
and :func:`new_sites` splits the patched engine's new sites (by function, against the
pristine engine's whole run) into those that synced again after start-up (warm-up and
timed generates: a problem) and those seen only during start-up (reported, not a
problem). A result without ``syncs_startup`` (recorded before this rule) counts every
new site as after start-up, as the old rule did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional

from .syncs import delta, site_function, split_key


def by_function(table: Mapping[str, int]) -> dict[str, int]:
    """``{"cpu|path:func:line": n}`` -> ``{"cpu path:func": n}`` (lines move when patched)."""
    out: dict[str, int] = {}
    for key, n in table.items():
        kind, site = split_key(key)
        name = f"{kind} {site_function(site)}"
        out[name] = out.get(name, 0) + int(n)
    return out


def new_sites(
    whole_pristine: Mapping[str, int], whole_patched: Mapping[str, int], startup_patched: Optional[Mapping[str, int]]
) -> tuple[list[str], list[str]]:
    """(new sites that synced after start-up, new sites seen only during start-up)."""
    new = set(by_function(whole_patched)) - set(by_function(whole_pristine))
    if startup_patched is None:
        return sorted(new), []
    after = by_function(delta(whole_patched, startup_patched))
    return sorted(s for s in new if after.get(s)), sorted(s for s in new if not after.get(s))


#: Below this many per decode step a site new in patched prints as 0.00 in the tables (one idle
#: batch of a run, as ``process_batch_result_idle`` at DP attention bs 8): the verdict compares
#: per-step rates, so such a site is a note, not a problem (issue 67, item 4).
NEGLIGIBLE_PER_STEP = 0.005


def split_by_rate(new: Iterable[str], counts: Mapping[str, int], steps: int) -> tuple[list[str], list[str]]:
    """(``new`` sites at ``NEGLIGIBLE_PER_STEP`` or more per step: problems, those below: notes).
    ``counts``: per site (the same names as ``new``), its count over ``steps`` decode steps; with
    no steps counted every new site stays a problem."""
    if not steps:
        return sorted(new), []
    rate = {s: counts.get(s, 0) / steps for s in new}
    return sorted(s for s, r in rate.items() if r >= NEGLIGIBLE_PER_STEP), sorted(
        s for s, r in rate.items() if r < NEGLIGIBLE_PER_STEP
    )


def negligible_notes(rows: list[dict]) -> list[str]:
    """Notes for the sites new in patched at under ``NEGLIGIBLE_PER_STEP`` per step (rows of
    report.py, rank_report.py; torch's count under ``waits``)."""
    out = []
    for r in rows:
        tag = f"{r['release']} {r['size']} bs={r['batch_size']}" + (f" rank {r['tp_rank']}" if "tp_rank" in r else "")
        steps = r.get("decode_steps", (0, 0))[1]
        for label, names in (
            ("sync sites", r.get("new_sites_negligible") or []),
            ("host-wait sites (torch's count)", (r.get("waits") or {}).get("new_negligible") or []),
        ):
            if names:
                out.append(
                    f"{tag}: {label} new in patched at 0.00 per step ({steps} steps; a note, not a "
                    f"problem): {', '.join(names)}"
                )
    return out
