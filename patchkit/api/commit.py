"""The last steps shared by apply and revert: the runtime folder and manifest
planned into the change, the write check, and the transaction."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Iterable

from patchkit.state import vendoring
from patchkit.errors import PatchkitError
from patchkit.state.record import FileRecord
from patchkit.tree import sha256

if TYPE_CHECKING:
    from patchkit.engine import Session
    from patchkit.results import Outcome
    from patchkit.state.record import Record
    from patchkit.registry import Patch
    from patchkit.state.snapshot import Snapshot
    from patchkit.tree import Tree


def check_writable(tree: "Tree", files: Iterable[str]) -> None:
    """Stop before any write if one of ``files`` cannot be written: the file,
    or, for a file to create, the nearest folder that exists. Mode bits count
    too: root may write anything, but a file the user marked read-only is not
    ours to replace (os.replace would)."""
    for rel in files:
        path = tree.path(rel)
        nodes = [("file", path)] if path.exists() else []
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        for what, node in (*nodes, ("folder", folder)):
            if not os.access(node, os.W_OK) or not node.stat().st_mode & stat.S_IWUSR:
                raise PatchkitError(f"{node}: read-only {what}, cannot write {path.name} (nothing was changed)")


def commit(session: "Session", verb: str, outcome: "Outcome", record: "Record") -> None:
    """Store the outcome's blobs, then write ``outcome.changed`` and
    ``record`` as one transaction (``verb``: apply or revert, for the journal)."""
    check_writable(session.tree, outcome.changed)  # again: runtime files were planned after the first check
    session.store.put_blobs(outcome.blobs.values())
    session.store.commit(verb, session.tree.package, outcome.changed, session.record, record)


def sync_runtime(snapshot: "Snapshot", record: "Record", patches: list["Patch"], outcome: "Outcome",
                 force: bool) -> None:
    """Plan the runtime folder and manifest for ``patches`` (those applied
    once this command is done, in the record's runtime mode) into
    ``outcome.changed`` and ``record``.

    A runtime file the user edited is replaced only with ``force`` (apply
    repairs a stale runtime; a copy of the edited file is kept), else the
    command stops, as for edits that overlap a patch."""
    mode = record.runtime or vendoring.DEFAULT_MODE
    wanted = vendoring.runtime_files(patches, mode)
    ours = record.created()  # runtime files, manifest
    created = [rel for rel in ours if rel != vendoring.MANIFEST]
    folder = snapshot.tree.path(vendoring.FOLDER)
    if not ours and folder.exists():
        raise PatchkitError(
            f"{folder}: exists and was not written by patchkit; refusing to vendor the runtime there "
            "(nothing was changed)"
        )
    for rel in dict.fromkeys([*created, *wanted]):
        current, target = snapshot.read(rel), wanted.get(rel)
        if target is not None and vendoring.stale_reason(rel, current, target) is None:
            continue  # same code (perhaps written by another patchkit version): leave it
        entry = record.files.get(rel)
        if current is not None and entry is not None and sha256(current) != entry.patched:
            path = snapshot.tree.path(rel)
            if not force:
                raise PatchkitError(
                    f"{path}: runtime file edited after apply; nothing was reverted "
                    "(undo the edits, or pass --force to discard them)"
                )
            kept = outcome.keep(current)
            outcome.messages.append(f"{path}: was edited; replaced by patchkit's runtime (your copy: .patchkit/blobs/{kept})")
        if current != target:
            outcome.changed[rel] = (current, target)
        if target is None:
            record.files.pop(rel, None)
        else:
            record.files[rel] = FileRecord(None, sha256(target))
    # Patches in registry order (the state's JSON sorts keys): the manifest's bytes do not depend on history.
    record.applied = {p.id: record.applied[p.id] for p in patches if p.id in record.applied}
    manifest = vendoring.manifest_bytes(record) if patches else None
    current = snapshot.read(vendoring.MANIFEST)
    if manifest != current:
        outcome.changed[vendoring.MANIFEST] = (current, manifest)
    if manifest is None:
        record.files.pop(vendoring.MANIFEST, None)
    else:
        record.files[vendoring.MANIFEST] = FileRecord(None, sha256(manifest))
