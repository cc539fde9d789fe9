"""The last step of apply and revert: what the command changes (``Outcome``),
the runtime folder and manifest planned into it, the write check, and the
transaction."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional

from patchkit.errors import PatchkitError
from patchkit.results import PatchReport, unified_diff
from patchkit.state import vendoring
from patchkit.state.record import FileRecord, Record
from patchkit.tree import Tree, check_writable, sha256, unwritable

if TYPE_CHECKING:
    from patchkit.engine import Session
    from patchkit.registry import Patch
    from patchkit.state.snapshot import Snapshot


@dataclass(frozen=True)
class Outcome:
    """What an apply or revert did (or, dry, would do). Made once, whole, by
    the command (``commit`` gives it back with the runtime folder planned in)."""

    reports: list[PatchReport]
    # file -> (old, new); None: the file does not exist (created / removed)
    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # patch ids applied/reverted now
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (patch id, why)
    messages: list[str] = field(default_factory=list)
    # Files changed now whose bytes before were their release's own (no vendor code: the audit skips them).
    release_own: list[str] = field(default_factory=list)
    # Backups and kept copies, stored by sha256 at commit (a dry run stores none).
    blobs: dict[str, bytes] = field(default_factory=dict)

    def diff(self, tree: Tree) -> str:
        return "".join(unified_diff(tree, rel, old, new) for rel, (old, new) in self.changed.items())


def kept(*copies: bytes) -> dict[str, bytes]:
    """Bytes to store as blobs at commit, by their sha256 (``Outcome.blobs``)."""
    return {sha256(data): data for data in copies}


@dataclass(frozen=True)
class RuntimePlan:
    """The runtime folder and manifest planned for the patches applied once
    a command is done (``sync_runtime``): the files it changes (rel -> (old,
    new)), the record that says so, what it tells, and the edited runtime
    files it keeps a copy of."""

    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]]
    record: Record
    messages: list[str]
    blobs: dict[str, bytes]


def commit(
    session: "Session",
    verb: str,
    outcome: Outcome,
    record: Record,
    runtime: Optional[list["Patch"]],
    force: bool,
    dry_run: bool,
    mode_check: bool = False,
) -> Outcome:
    """Finish ``verb`` (apply or revert): ``outcome`` as written. ``runtime``:
    the patches applied once it is done, whose runtime folder and manifest
    are planned into the outcome and ``record`` (None: they stay as they
    are; ``force``: as ``sync_runtime``; ``mode_check``: apply refuses a
    runtime mode that cannot serve them all, ``vendoring.check_mode``, where
    revert goes back whatever the mode). Every file to change must be
    writable (a dry run, which writes nothing, says where one is not). Then
    the outcome's blobs and the backups a clone recovered are stored, and the
    changed files and the record written as one transaction, where there is
    something to write."""
    if runtime is not None:
        planned = sync_runtime(session.snapshot, record, runtime, force)
        if mode_check:
            vendoring.check_mode(runtime, record.runtime or vendoring.DEFAULT_MODE)
        record = planned.record
        outcome = replace(
            outcome,
            changed={**outcome.changed, **planned.changed},
            messages=outcome.messages + planned.messages,
            blobs={**outcome.blobs, **planned.blobs},
        )
    if dry_run:  # it writes nothing: a read-only tree is told what a real run would say
        why = unwritable(session.tree, outcome.changed)
        return replace(
            outcome, messages=[*outcome.messages, f"{why}: the run itself stops here"] if why else outcome.messages
        )
    check_writable(session.tree, outcome.changed)
    if not (outcome.changed or record.applied != session.record.applied):
        return outcome
    session.writing = outcome  # what an interrupt reports once the store says it is committed
    session.store.commit(
        verb,
        session.tree.package,
        outcome.changed,
        session.record,
        record,
        backups=[*outcome.blobs.values(), *session.recovered.values()],
    )
    return outcome


def sync_runtime(snapshot: "Snapshot", record: Record, patches: list["Patch"], force: bool) -> RuntimePlan:
    """The runtime folder and manifest for ``patches`` (those applied once
    this command is done, in ``record``'s runtime mode), planned from the
    tree as read (``snapshot``) and ``record`` (left as it is); with no
    patch left, the planned record forgets the runtime.

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
    record = record.copy()
    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = {}
    messages: list[str] = []
    blobs: dict[str, bytes] = {}
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
            blobs.update(kept(current))
            messages.append(
                f"{path}: was edited; replaced by patchkit's runtime (your copy: .patchkit/blobs/{sha256(current)})"
            )
        if current != target:
            changed[rel] = (current, target)
        if target is None:
            record.files.pop(rel, None)
        else:
            record.files[rel] = FileRecord(None, sha256(target))
    # Patches in registry order (the state's JSON sorts keys): the manifest's bytes do not depend on history.
    record.applied = {p.id: record.applied[p.id] for p in patches if p.id in record.applied}
    manifest = vendoring.manifest_bytes(record) if patches else None
    current = snapshot.read(vendoring.MANIFEST)
    if manifest != current:
        changed[vendoring.MANIFEST] = (current, manifest)
    if manifest is None:
        record.files.pop(vendoring.MANIFEST, None)
    else:
        record.files[vendoring.MANIFEST] = FileRecord(None, sha256(manifest))
    if not record.applied:
        record.forget_runtime()
    return RuntimePlan(changed, record, messages, blobs)
