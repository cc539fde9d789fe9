#!/usr/bin/env python3
"""The sha256 of every file an apply of all built-in patches writes, on each
release patchkit knows (``patchkit.known_releases``), kept in
tests/patched_digests.json: tests/trees/test_patched_digests.py holds the code
against them, so that a refactor that changes one written byte fails.

    python scripts/patched_digests.py [RELEASE ...]   # rewrite the file (all releases if none named)

Rewrite it only for a change meant to alter what patchkit writes (a patch's
new bytes, a new release, a new patchkit version in the runtime manifest),
and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DIGESTS = ROOT / "tests" / "patched_digests.json"


def releases() -> list[str]:
    from patchkit import known_releases

    return sorted(
        known_releases._table()[0],
        key=lambda v: [int(p) if p.isdigit() else p for p in v.replace(".post", ".").split(".")],
    )


def written_digests(version: str, *, reference: bool = False) -> dict[str, str | None]:
    """rel -> sha256 of the bytes ``patchkit apply`` (every built-in patch)
    writes to the release's tree (None: a file it removes). A dry run: it
    computes exactly what a real apply commits, and writes nothing (no lock,
    no state), so it runs on the fetched release itself.

    ``reference`` (how ``main`` records them): the plain engine, every file
    parsed whole, no transform cache, one process. The test then compares
    what the engine of the run gives (parsed in part, cached, in workers)
    with it: the recorded bytes are the reference of the partial parse
    (tests/trees/test_transform_partial.py) and of the cache
    (tests/trees/test_transform_cache.py)."""
    from patchkit import api, known_releases
    from patchkit.fetch import fetch_tree

    tree = fetch_tree(version)
    if reference:
        saved = {name: os.environ.get(name) for name in ("PATCHKIT_TRANSFORM_CACHE", "PATCHKIT_JOBS")}
        os.environ.update(PATCHKIT_TRANSFORM_CACHE="off", PATCHKIT_JOBS="1")
        ships, known_releases.ships = known_releases.ships, lambda rel, source: False
    try:
        outcome = api.apply(str(tree), dry_run=True, audit_vendor=False).outcome
    finally:
        if reference:
            known_releases.ships = ships
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
    return {
        rel: None if new is None else hashlib.sha256(new).hexdigest()
        for rel, (_old, new) in sorted(outcome.changed.items())
    }


def main(argv: list[str]) -> None:
    known = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    for version in argv or releases():
        known[version] = written_digests(version, reference=True)
        print(f"{version}: {len(known[version])} files", file=sys.stderr)
    DIGESTS.write_text(json.dumps(dict(sorted(known.items())), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
