"""Which record of what patchkit did to a tree is believed: the tree is the truth.

Two records can say what patchkit applied: the local ``.patchkit/state.json``
(git-ignored, with the backups) and the tracked ``srt/_patchkit/manifest.json``
(travels with the fork through clones, checkouts and rebases). The local state
is only a cache of the tree. It is believed only where it agrees with the tree:

- it was made on the release the tree is now (a fork moved to a new base
  keeps its ``.patchkit/`` but not the bytes it recorded);
- it says what the manifest says (``git checkout`` brings back a manifest the
  local state no longer records, or takes one away);
- without a manifest, the tree still holds some of the bytes it recorded.

A manifest made on another release is a leftover of an earlier base: its
runtime folder and itself are the only files patchkit may still call its own
(``apply`` rewrites them, ``revert`` removes them); the target files it lists
belong to the new release.

Pure: the caller reads the files and moves a disbelieved state aside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from patchkit.state import vendoring
from patchkit.state.record import FileRecord, Record


@dataclass(frozen=True)
class Believed:
    record: Record
    source: str  # state | manifest | leftovers | none
    disbelieved: Optional[str] = None  # why the local state is not believed
    leftovers_of: Optional[str] = None  # the release a leftover manifest was made on
    leftovers: list[str] = field(default_factory=list)


def reconcile(
    version: str, local: Optional[Record], manifest: Optional[Record], current_sha: Callable[[str], Optional[str]]
) -> Believed:
    """The record to believe for a tree of sglang ``version``; ``current_sha``
    gives the sha256 of a file of the tree now (None: absent)."""
    if manifest is not None and manifest.sglang not in (None, version):
        leftovers = [rel for rel, f in manifest.files.items() if f.original is None and current_sha(rel)]
        leftovers.append(vendoring.MANIFEST)
        record = Record(sglang=version, files={rel: FileRecord(None, current_sha(rel)) for rel in leftovers})
        why = _disbelief(version, local, manifest, current_sha) if local is not None and not local.empty else None
        return Believed(record, "leftovers", why, manifest.sglang, sorted(leftovers))
    why = _disbelief(version, local, manifest, current_sha) if local is not None else None
    if local is not None and why is None:
        return Believed(local, "state")
    if manifest is not None:
        return Believed(manifest, "manifest", why)
    return Believed(Record(sglang=version), "none", why)


def _disbelief(
    version: str, local: Record, manifest: Optional[Record], current_sha: Callable[[str], Optional[str]]
) -> Optional[str]:
    """Why ``local`` does not describe the tree, or None when it does."""
    if local.sglang and local.sglang != version:
        return f"it was made on sglang {local.sglang} and the tree is now sglang {version}"
    if manifest is not None:
        if manifest.sglang not in (None, version):
            return f"it was made on sglang {manifest.sglang} and the tree is now sglang {version}"
        if not agrees(local, manifest):
            return "it disagrees with the tree's manifest (srt/_patchkit/manifest.json), which is tracked by git"
        return None
    changed = local.changed()
    if local.applied and changed and not any(current_sha(rel) == f.patched for rel, f in changed.items()):
        return "the tree holds none of the patched bytes it records, and no manifest"
    return None


def agrees(local: Record, manifest: Record) -> bool:
    """Do the local state and the manifest record the same patches and bytes?"""
    mine = {rel: f for rel, f in local.files.items() if rel != vendoring.MANIFEST}
    return set(local.applied) == set(manifest.applied) and mine == manifest.files
