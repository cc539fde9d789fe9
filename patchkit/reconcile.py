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

from dataclasses import dataclass, field
from typing import Callable, Optional

from patchkit import vendoring
from patchkit.state import STATE_FORMAT


def empty_state(version: str) -> dict:
    return {"format": STATE_FORMAT, "applied": {}, "files": {}, "sglang": version}


@dataclass(frozen=True)
class Believed:
    state: dict
    source: str  # state | manifest | leftovers | none
    disbelieved: Optional[str] = None  # why the local state is not believed
    leftovers_of: Optional[str] = None  # the release a leftover manifest was made on
    leftovers: list[str] = field(default_factory=list)


def reconcile(version: str, local: Optional[dict], manifest: Optional[dict],
              current_sha: Callable[[str], Optional[str]]) -> Believed:
    """The record to believe for a tree of sglang ``version``; ``current_sha``
    gives the sha256 of a file of the tree now (None: absent)."""
    if manifest is not None and manifest.get("sglang") not in (None, version):
        leftovers = [rel for rel, f in manifest["files"].items() if f["before"] is None and current_sha(rel)]
        leftovers.append(vendoring.MANIFEST)
        state = empty_state(version)
        state["files"] = {rel: {"original": None, "patched": current_sha(rel)} for rel in leftovers}
        why = None
        if _nonempty(local):
            why = _disbelief(version, local, manifest, current_sha)
        return Believed(state, "leftovers", why, manifest["sglang"], sorted(leftovers))
    why = _disbelief(version, local, manifest, current_sha) if local is not None else None
    if local is not None and why is None:
        return Believed(local, "state")
    if manifest is not None:
        return Believed(vendoring.state_from_manifest(manifest), "manifest", why)
    return Believed(empty_state(version), "none", why)


def _nonempty(state: Optional[dict]) -> bool:
    return bool(state and (state["applied"] or state["files"]))


def _disbelief(version: str, local: dict, manifest: Optional[dict],
               current_sha: Callable[[str], Optional[str]]) -> Optional[str]:
    """Why ``local`` does not describe the tree, or None when it does."""
    made_on = local.get("sglang")
    if made_on and made_on != version:
        return f"it was made on sglang {made_on} and the tree is now sglang {version}"
    if manifest is not None:
        if manifest.get("sglang") not in (None, version):
            return f"it was made on sglang {manifest['sglang']} and the tree is now sglang {version}"
        if not agrees(local, manifest):
            return "it disagrees with the tree's manifest (srt/_patchkit/manifest.json), which is tracked by git"
        return None
    changed = {rel: e for rel, e in local["files"].items() if e["original"] is not None}
    if local["applied"] and changed and not any(current_sha(rel) == e["patched"] for rel, e in changed.items()):
        return "the tree holds none of the patched bytes it records, and no manifest"
    return None


def agrees(local: dict, manifest: dict) -> bool:
    """Do the local state and the manifest record the same patches and bytes?"""
    mine = {rel: (e["original"], e["patched"]) for rel, e in local["files"].items() if rel != vendoring.MANIFEST}
    theirs = {rel: (f["before"], f["after"]) for rel, f in manifest["files"].items()}
    return set(local["applied"]) == set(manifest["patches"]) and mine == theirs
