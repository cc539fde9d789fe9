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

from collections.abc import Mapping
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
