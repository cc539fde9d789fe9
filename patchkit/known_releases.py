"""Known sglang releases' hashes of the files patches touch and of every
module under srt/ that reads the CPU seq_lens mirror, shipped with patchkit
(``known_releases.json``, written by ``scripts/release_hashes.py``).

apply's fetch step reads a release's ``shipped`` hashes once and checks each
file against them: a file whose bytes are its release's own has no vendor
code, so the vendor-code check needs no download for it; a file a known
release does not ship is all the vendor's. The
audit asks it too (``patchkit.audit.origins.KnownRelease``): a module that is
its release's own bytes holds only the release's reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Optional

PATH = Path(__file__).with_name("known_releases.json")


@functools.lru_cache(maxsize=1)
def _table() -> tuple[frozenset, dict[str, dict[str, set[str]]]]:
    try:
        data = json.loads(PATH.read_text())
    except (OSError, ValueError):
        return frozenset(), {}
    files = {rel: {d: set(v.split()) for d, v in shas.items()} for rel, shas in data.get("files", {}).items()}
    return frozenset(data.get("releases", ())), files


def knows(version: str) -> bool:
    return version in _table()[0]


@functools.lru_cache(maxsize=4)
def shipped(version: str) -> dict[str, Optional[str]]:
    """The sha256 (hex) that the release ``version`` ships for each file the
    table holds, None where the release has no such file; empty for a
    release the table does not know. A file missing here is one the table
    does not know (nothing can be said of it)."""
    releases, files = _table()
    if version not in releases:
        return {}
    return {rel: next((d for d, v in shas.items() if version in v), None) for rel, shas in files.items()}


def release_bytes(version: str, rel: str, source: bytes) -> Optional[bytes]:
    """What the release ``version`` ships as ``rel``, where the shipped hashes
    know it without a download: ``source`` itself when its sha256 is that
    release's, b"" when the release has no such file; else None (unknown
    release or file, or a file the vendor changed)."""
    table = shipped(version)
    if rel not in table:
        return None
    if table[rel] is None:
        return b""
    return source if hashlib.sha256(source).hexdigest() == table[rel] else None


def is_release_sha(version: str, rel: str, sha: str) -> bool:
    """Whether ``sha`` (a sha256, hex) is that of ``rel`` as the release ``version`` ships it."""
    releases, files = _table()
    return version in releases and version in files.get(rel, {}).get(sha, ())


def tracks(rel: str) -> bool:
    """Whether some known release has ``rel`` among the files the table holds
    (the files patches touch, the modules that read the mirror)."""
    return rel in _table()[1]


def ships(rel: str, source: bytes) -> bool:
    """Whether ``source`` is, byte for byte, ``rel`` as some known release ships it."""
    return hashlib.sha256(source).hexdigest() in _table()[1].get(rel, {})
