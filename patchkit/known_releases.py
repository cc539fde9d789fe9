"""Known sglang releases' hashes of the files patches touch and of every
module under srt/ that reads the CPU seq_lens mirror, shipped with patchkit
(``known_releases.json``, written by ``scripts/release_hashes.py``).

apply's fetch step asks ``release_bytes`` first: a file whose bytes are its
release's own has no vendor code, so the vendor-code check needs no download
for it; a file a known release does not ship is all the vendor's. The
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


def release_bytes(version: str, rel: str, source: bytes) -> Optional[bytes]:
    """What the release ``version`` ships as ``rel``, where the shipped hashes
    know it without a download: ``source`` itself when its sha256 is that
    release's, b"" when the release has no such file; else None (unknown
    release or file, or a file the vendor changed)."""
    releases, files = _table()
    if version not in releases or rel not in files:
        return None
    shas = files[rel]
    versions = shas.get(hashlib.sha256(source).hexdigest())
    if versions is not None and version in versions:
        return source
    if not any(version in v for v in shas.values()):
        return b""
    return None


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


def contradicts(version: str, rel: str, data: bytes) -> bool:
    """Whether the shipped hashes say ``data`` is *not* what the release
    ``version`` ships as ``rel`` (b"": the file is absent): a cached release
    that was edited, cut short or mixed up. False where they do not know."""
    releases, files = _table()
    if version not in releases or rel not in files:
        return False
    return release_bytes(version, rel, data) != data
