"""Where a read of the mirror comes from: the release ("release": its own
code, which the patches guard) or the vendor ("vendor": a fork's code, the
vendor's to guard), from the release's tree in the cache (``Release``), the
hashes patchkit ships (``KnownRelease``), or the tree's manifest
(``patched_release_modules``)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from patchkit.audit.facts import MANIFEST, facts_of
from patchkit.audit.reads import Read
from patchkit.errors import untrusted_json
from patchkit.tree import read_regular


class Release:
    def __init__(self, package: Path) -> None:
        self.package = package

    def ships(self, rel: str, data: bytes) -> bool:
        """Are ``data`` the release's own bytes of ``rel``?"""
        try:
            return (self.package / rel).read_bytes() == data
        except OSError:
            return False

    def origins(self, rel: str, data: bytes, reads: list[Read]) -> list[str]:
        """ "release" for each read the release ships, else "vendor": lines
        the release has unchanged (aligned as ``diff`` does) are its; in a
        changed run of lines, a read is the release's while the release's run
        has one with the same function and code left."""
        path = self.package / rel
        if not path.is_file():
            return ["vendor"] * len(reads)
        return diff_origins(rel, path.read_bytes(), data, reads)


def diff_origins(rel: str, shipped: bytes, data: bytes, reads: list[Read]) -> list[str]:
    """Release.origins with the release's bytes of ``rel`` in hand."""
    if shipped == data:
        return ["release"] * len(reads)
    from difflib import SequenceMatcher

    facts = facts_of(rel, shipped)
    old_reads = facts.reads if facts else []
    opcodes = SequenceMatcher(None, shipped.splitlines(), data.splitlines()).get_opcodes()
    result = []
    left: dict[tuple, Counter] = {}
    for read in reads:
        line = read.line - 1
        tag, i1, i2, j1, j2 = next(op for op in opcodes if op[3] <= line < op[4] or op[3] == op[4] == line)
        if tag == "equal":
            result.append("release")
            continue
        if tag == "insert":
            result.append("vendor")
            continue
        counts = left.setdefault((i1, i2), Counter((r.function, r.code) for r in old_reads if i1 < r.line <= i2))
        key = (read.function, read.code)
        result.append("release" if counts[key] > 0 else "vendor")
        counts[key] -= 1
    return result


def patched_release_modules(package: Path, sources: dict[str, bytes]) -> set[str]:
    """The modules patchkit changed from the release's own bytes and nobody
    changed since: the tree's manifest (``srt/_patchkit/manifest.json``,
    tracked with the tree) records each file's sha256 before and after, and
    the ``before`` is the release's own by the hashes patchkit ships. Their
    reads are the release's (patchkit's edits only guard), whether or not
    the release is in the cache: what the audit says of them is a function
    of the tree's bytes alone. Only paths in ``sources`` are looked up."""
    from patchkit import known_releases
    from patchkit.tree import _read_version, base_release

    try:
        doc = untrusted_json(read_regular(package / MANIFEST, package) or b"")
        version = base_release(_read_version(package))  # the release the tree is now
        files = doc["files"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    found = set()
    for rel, data in sources.items():
        entry = files.get(rel) if isinstance(files, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("before"), str) and version):
            continue
        if entry.get("after") == hashlib.sha256(data).hexdigest() and known_releases.is_release_sha(
            version, rel, entry["before"]
        ):
            found.add(rel)
    return found


def manifest_digest(package: Path) -> bytes:
    """The manifest's bytes' sha256 (b"" without one): part of what an audit is a function of."""
    try:
        data = read_regular(package / MANIFEST, package)
        return b"" if data is None else hashlib.sha256(data).digest()
    except OSError:
        return b""


class KnownRelease:
    """A release's origins without its tree: a module whose bytes are the
    release's own by the hashes patchkit ships (``patchkit.known_releases``:
    every module under srt/ that reads the mirror) has only the release's
    reads; one the release does not ship is all the vendor's; of any other
    (a module the vendor changed) the origin is unknown until the release is
    fetched."""

    def __init__(self, version: str, files: Optional[dict[str, Optional[bytes]]] = None) -> None:
        self.version = version
        self.files = files or {}  # the release's bytes of some modules, where already fetched (apply's fetch step)

    @classmethod
    def of(cls, package: Path, files: Optional[dict[str, Optional[bytes]]] = None) -> Optional["KnownRelease"]:
        from patchkit import known_releases
        from patchkit.tree import _read_version, base_release

        version = base_release(_read_version(package))  # a fork's local build (0.5.11+acme): its release's
        return cls(version, files) if version and known_releases.knows(version) else None

    def ships(self, rel: str, data: bytes) -> bool:
        from patchkit import known_releases

        return known_releases.release_bytes(self.version, rel, data) == data

    def origins(self, rel: str, data: bytes, reads: list[Read]) -> Sequence[Optional[str]]:
        from patchkit import known_releases

        fetched = self.files.get(rel)
        if fetched is not None:  # a module apply changes: its release bytes were fetched
            return diff_origins(rel, fetched, data, reads) if fetched else ["vendor"] * len(reads)
        # A module no known release has among those reading the mirror: this release does not ship
        # its reads, so they are the vendor's (as the release's tree would tell: cache or not, one answer).
        shipped = known_releases.release_bytes(self.version, rel, data) if known_releases.tracks(rel) else b""
        origin = "release" if shipped == data and shipped else "vendor" if shipped == b"" else None
        return [origin] * len(reads)
