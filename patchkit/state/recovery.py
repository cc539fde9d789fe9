"""``patchkit revert --recover``: every file back to its original, from the
backups alone, when the journal (or the state) cannot be read.

Every transaction stores its journal as a blob too (``Store.commit``), and
the bytes each side of it needs before the journal is written. So the blobs
hold, for every file patchkit ever wrote, records that name its patched bytes
and its original: the journals' states before and after, plus ``state.json``
and the tracked manifest where they can be read. A file whose bytes now are
bytes patchkit wrote goes back to that original (a file patchkit created is
removed); a file whose bytes patchkit never wrote (the release's, or edited
by hand since) is left as it is, and named. The damaged journal and state are
copied to ``.patchkit/set-aside/`` first, never deleted.

Pure planning here; the writes are one ``Store.commit`` transaction, with
what a killed run left around it removed (its temp files, before; the
folders a file it was creating left empty, after).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from patchkit.errors import PatchkitError, untrusted_json
from patchkit.state import (
    Store,
    file_sha,
    make_folders,
    originals,
    remove_all_temp_files,
    remove_temp_files,
    vendoring,
    write_or_remove,
)
from patchkit.state.record import Record
from patchkit.tree import Tree, read_regular, writable

JOURNAL_START = b'{\n "files": ['  # how every journal's bytes begin (sorted keys, indent 1)


@dataclass
class Recovery:
    """What ``--recover`` will write: rel -> (bytes now, original; None: remove)."""

    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # bytes patchkit never wrote: left as they are
    named: list[str] = field(default_factory=list)  # every file a record names
    created: list[str] = field(default_factory=list)  # those patchkit created (the runtime folder, the manifest)
    set_aside: list[Path] = field(default_factory=list)


def records(store: Store, tree: Tree) -> list[Record]:
    """Every record of patched bytes and their originals that can be read:
    the journals kept among the blobs, the journal, the state, the manifest."""
    found: list[Record] = []
    candidates = [store.journal, *(sorted(store.blobs.iterdir()) if store.blobs.is_dir() else [])]
    for path in candidates:
        doc = _journal(path, store.root)
        if doc is None:
            continue
        with contextlib.suppress(KeyError, TypeError, AttributeError, PatchkitError):
            found.extend(Record.from_state(doc[key], str(path)) for key in ("state", "old_state") if doc.get(key))
    for read in (
        store.load,
        lambda: vendoring.read_manifest(tree.read(vendoring.MANIFEST) or b"", str(tree.path(vendoring.MANIFEST))),
    ):
        with contextlib.suppress(OSError, PatchkitError):
            record = read()
            if record is not None:
                found.append(record)
    return found


def _journal(path: Path, root: Path) -> Optional[dict]:
    """The journal a blob holds, if it is one."""
    with contextlib.suppress(OSError, ValueError, PatchkitError):
        data = read_regular(path, root)
        if data is not None and data.startswith(JOURNAL_START):
            doc = untrusted_json(data)
            return doc if isinstance(doc, dict) else None
    return None


def lost_writes(store: Store, record: Record, current_sha: Callable[[str], Optional[str]]) -> list[str]:
    """Files that hold bytes the last transaction wrote and ``record`` does
    not name: its journal was lost (removed by hand) before it was settled.
    They are patchkit's half-done work, never the release's own code."""
    if not store.blobs.is_dir() or store.journal.exists():
        return []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(store.blobs), key=lambda e: e.stat().st_mtime, reverse=True):
            doc = _journal(Path(entry.path), store.root)
            if doc is None:
                continue
            with contextlib.suppress(KeyError, TypeError, AttributeError, PatchkitError):
                last = Record.from_state(doc["state"], entry.path)
                return sorted(
                    rel
                    for rel, f in last.changed().items()
                    if f.patched != f.original
                    and current_sha(rel) == f.patched
                    and (record.files.get(rel) is None or record.files[rel].patched != f.patched)
                )
            return []
    return []


def plan(store: Store, tree: Tree) -> Recovery:
    """Each file a record names, from the bytes patchkit wrote back to the original."""
    originals: dict[tuple[str, str], Optional[str]] = {}  # (rel, patched sha) -> original sha
    for record in records(store, tree):
        for rel, entry in record.files.items():
            if entry.patched is not None:
                originals.setdefault((rel, entry.patched), entry.original)
    recovery = Recovery(
        named=sorted({rel for rel, _ in originals}),
        created=sorted({rel for (rel, _), original in originals.items() if original is None}),
    )
    for rel in recovery.named:
        path = tree.path(rel)
        now = file_sha(path, tree.package)
        if now is None:
            continue
        if (rel, now) not in originals:
            if now not in {o for (r, _), o in originals.items() if r == rel}:
                recovery.unknown.append(rel)
            continue
        original = originals[(rel, now)]
        recovery.changed[rel] = (tree.read(rel), None if original is None else _original(store, tree, rel, original))
    return recovery


def _original(store: Store, tree: Tree, rel: str, digest: str) -> bytes:
    """The original of ``rel``: its backup, or where a backup is missing or
    corrupt, where a clone finds it (the release, git history: ``originals``,
    whose refusal fits the tree's layout)."""
    with contextlib.suppress(PatchkitError):
        data = store.read_blob(digest, missing_ok=True)
        if data is not None:
            return data
    return originals.find(tree, rel, digest)


def set_aside(store: Store) -> list[Path]:
    """Copy the journal and the state out of the way (kept, never deleted);
    the transaction then replaces them."""
    copied = []
    folder = store.folder / "set-aside"
    for path in (store.journal, store.folder / "state.json"):
        if path.exists():
            make_folders(folder)
            target = folder / f"{path.stem}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
            shutil.copy2(path, target)
            copied.append(target)
    return copied


def recover(store: Store, tree: Tree, dry_run: bool) -> Recovery:
    """Plan, then (not ``dry_run``) set the journal and state aside and write
    every original back as one transaction whose new state is empty. Where
    that transaction fails (and is rolled back), the damaged journal goes
    back in place: every command keeps naming ``--recover``."""
    recovery = plan(store, tree)
    for rel in recovery.changed:
        writable(tree.package, rel)  # every path, before any write
    if dry_run:
        return recovery
    try:
        recovery.set_aside = set_aside(store)
    except OSError as exc:
        raise PatchkitError(
            f"{store.folder / 'set-aside'}: cannot write ({exc.strerror}); nothing was changed"
        ) from None
    leftovers(store, tree, recovery.named)
    try:
        store.commit("revert", tree.package, recovery.changed, Record(sglang=tree.version), Record(sglang=tree.version))
    except PatchkitError:
        journal = [p for p in recovery.set_aside if p.name.startswith("journal-")]
        if journal and not store.journal.exists():
            with contextlib.suppress(OSError):
                shutil.copy2(journal[0], store.journal)
        raise
    for rel in recovery.created:  # the folders a kill left without the file it was creating (``srt/_patchkit/``)
        if tree.read(rel) is None:
            write_or_remove(tree.package, rel, None)
    return recovery


def leftovers(store: Store, tree: Tree, named: list[str]) -> None:
    """Remove what a killed transaction left that no record names: the temp
    files of its writes, beside each file it wrote and in ``.patchkit/``
    (they hold bytes patchkit was writing, never the user's)."""
    for rel in named:
        remove_temp_files(tree.path(rel))
    for folder in (store.folder, store.blobs):
        remove_all_temp_files(folder)
