"""The last steps shared by apply and revert: the runtime folder and manifest
planned into the change, the write check, and the transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patchkit.state import vendoring
from patchkit.errors import PatchkitError
from patchkit.state.record import FileRecord
from patchkit.tree import check_writable, sha256

if TYPE_CHECKING:
    from patchkit.engine import Session
    from patchkit.results import Outcome
    from patchkit.state.record import Record
    from patchkit.registry import Patch
    from patchkit.state.snapshot import Snapshot


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
