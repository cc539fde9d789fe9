"""What patchkit remembers about a tree, in ``<package>/.patchkit``.

- ``state.json``: which patches are applied, and per touched file the sha256 of
  its original and patched bytes.
- ``blobs/<sha256>``: content-addressed bytes (originals for exact revert,
  patched versions for 3-way merges with user edits, staged writes).
- ``journal.json``: present only while a transaction writes files. It names
  the command (apply or revert), each file's sha256 before and after, and the
  state before and after; every blob either side needs is stored before it is
  written. A later run of the same command finishes the transaction, a run of
  the other one rolls it back; read commands only report it. A copy of it is
  kept among the blobs, for ``revert --recover`` (``patchkit.state.recovery``).
  A write that fails rolls the transaction back at once (``Store.commit``).
- ``set-aside/``: local state that disagreed with the tree (or could not be
  read), moved out of the way (never deleted) by a command that rebuilt it.
- ``lock``: serialises patchkit processes on one tree.
- ``cache.json``: what a session learnt of the tree's bytes
  (``patchkit.detection_cache``): detection results by codemod and file
  sha256, so ``status`` and ``verify`` need not parse files that did not
  change, and the audit's counts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Optional

from patchkit import lifetimes, tree
from patchkit.errors import PatchkitError, untrusted_json
from patchkit.state.files import (
    TEMP_SUFFIX,  # noqa: F401 - its home
    atomic_write,
    crash_point,
    fsync_dir,  # noqa: F401 - their home
    make_folders,
    open_owned,
    remove,
    remove_all_temp_files,
    remove_temp_files,
    write_or_remove,
)
from patchkit.state.journal import Pending, cannot_write, read_journal, settling
from patchkit.state.record import CorruptState, Record
from patchkit.state.signals import held_signals
from patchkit.tree import sha256


class Store:
    """The ``.patchkit`` folder of one tree."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.root = folder.parent  # the package: every read stays inside it (``tree.read_regular``)
        self.blobs = folder / "blobs"
        # Set inside the write's held signals, once its transaction is whole: an interrupt
        # that lands between the commit and its caller's return still knows all was written.
        self.committed = False
        refuse_links(folder)

    def ensure_folder(self) -> None:
        make_folders(self.folder)
        ignore = self.folder / ".gitignore"
        if not ignore.exists():
            # Keep patchkit's state out of the fork's git status.
            atomic_write(ignore, b"*\n")  # a kill mid-write must not leave an empty one

    # -- blobs ---------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        return self.put_blobs([data])[0]

    def put_blobs(self, blobs: Iterable[bytes]) -> list[str]:
        """Store each of ``blobs`` (those not stored yet), durable on return:
        each file fsynced, then the blobs folder once (not once a blob)."""
        digests, written = [], False
        for data in blobs:
            digests.append(digest := sha256(data))
            path = self.blobs / digest
            if not path.exists():
                self.ensure_folder()  # never a .patchkit/ without its .gitignore
                if self.blobs.exists() and not self.blobs.is_dir():
                    raise PatchkitError(
                        f"{self.blobs}: not a folder, where patchkit keeps its backups "
                        "(move it away; nothing was changed)"
                    )
                make_folders(self.blobs, private=True)
                atomic_write(path, data, sync_folder=False)
                written = True
        if written:
            fsync_dir(self.blobs)
        return digests

    def has_blob(self, digest: str) -> bool:
        return (self.blobs / tree.blob_name(digest, str(self.blobs))).is_file()

    def get_blob(self, digest: str) -> bytes:
        data = self.read_blob(digest, missing_ok=False)
        assert data is not None  # missing: read_blob raised
        return data

    def read_blob(self, digest: str, missing_ok: bool) -> Optional[bytes]:
        """The stored bytes of sha256 ``digest``, checked; None where none
        are stored and ``missing_ok`` (else that is damaged state)."""
        path = self.blobs / tree.blob_name(digest, str(self.blobs))
        try:
            data = tree.read_regular(path, self.root)
        except OSError:
            data = None
        if data is None:
            if missing_ok and not path.is_file():
                return None
            raise PatchkitError(f"{path}: backup missing; .patchkit state is damaged")
        if sha256(data) != digest:
            raise PatchkitError(f"{path}: backup corrupt (sha256 mismatch); .patchkit state is damaged")
        return data

    # -- state ---------------------------------------------------------------

    def has_state(self) -> bool:
        return (self.folder / "state.json").exists()

    def load(self) -> Optional[Record]:
        """The local record, or None where there is none."""
        path = self.folder / "state.json"
        try:
            data = tree.read_regular(path, self.root)
            if data is None:
                return None
            doc = untrusted_json(data)
        except (OSError, ValueError):
            raise CorruptState(f"{path}: corrupt patchkit state (not the expected JSON)") from None
        if not isinstance(doc, dict):
            raise CorruptState(f"{path}: corrupt patchkit state (not the expected JSON)")
        return Record.from_state(doc, str(path))

    def save(self, record: Record) -> None:
        self.ensure_folder()
        atomic_write(self.folder / "state.json", _dumps(record.to_state()))

    def set_aside(self) -> Path:
        """Move ``state.json`` out of the way (kept, never deleted), for a
        command that found it disagreeing with the tree."""
        folder = self.folder / "set-aside"
        make_folders(folder)
        target = folder / f"state-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
        os.replace(self.folder / "state.json", target)
        fsync_dir(self.folder)
        return target

    # -- detection cache -----------------------------------------------------

    def load_cache(self, key: str) -> object:
        """The entries ``save_cache`` kept under ``key``; {} under another key."""
        try:
            data = untrusted_json(tree.read_regular(self.folder / "cache.json", self.root) or b"{}")
            return data["entries"] if data.get("key") == key else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def save_cache(self, key: str, entries: object) -> None:
        with contextlib.suppress(OSError):
            self.ensure_folder()
            atomic_write(self.folder / "cache.json", _dumps({"key": key, "entries": entries}))

    # -- transactions --------------------------------------------------------

    @property
    def journal(self) -> Path:
        return self.folder / "journal.json"

    def commit(
        self,
        verb: str,
        root: Path,
        changes: dict[str, tuple[Optional[bytes], Optional[bytes]]],
        old_record: Record,
        new_record: Record,
        backups: Iterable[bytes] = (),
    ) -> None:
        """Write files and the new state as one transaction.

        changes: relpath -> (bytes on disk now, new bytes); None: no such
        file (created / removed). Both sides, and ``backups`` (originals a
        clone recovered, copies of edits), are stored as blobs before the
        journal, so an interrupted transaction can be finished or rolled back.
        SIGINT and SIGTERM wait until it is committed.

        A write that fails (disk full, permission: any ``OSError``) is rolled
        back at once: every file written gets its bytes before, the state
        and the journal go back, and the failure is one line. Where the
        rollback cannot write either, the journal stays for the next command."""
        entries = [
            {"file": rel, "before": None if old is None else sha256(old), "after": None if new is None else sha256(new)}
            for rel, (old, new) in changes.items()
        ]
        journal = _dumps(
            {"verb": verb, "files": entries, "old_state": old_record.to_state(), "state": new_record.to_state()}
        )
        try:
            self.ensure_folder()
            # The journal among the blobs too: `revert --recover` reads it there, should journal.json be lost.
            self.put_blobs(
                [*backups, *(data for pair in changes.values() for data in pair if data is not None), journal]
            )
        except OSError as exc:
            raise self._failed(exc, verb, "nothing was changed") from None
        with contextlib.suppress(OSError):  # the newest journal among the blobs is the last one (recovery.lost_writes)
            os.utime(self.blobs / sha256(journal))
        written: list[str] = []  # files whose write began (a failed one may have made its folder)
        saved = False
        with held_signals():
            try:
                atomic_write(self.journal, journal)
                crash_point("journal")
                for rel, (_, data) in changes.items():
                    written.append(rel)
                    write_or_remove(root, rel, data, sync_folder=False)
                    crash_point("file")
                # The files' renames are durable before the state says they happened:
                # each folder once, not once a file (the journal covers a kill before).
                for folder in dict.fromkeys(
                    tree.inside(root, rel).parent for rel, (_, data) in changes.items() if data is not None
                ):
                    fsync_dir(folder)
                self.save(new_record)
                saved = True
                crash_point("state")
                remove(self.journal)
                fsync_dir(self.folder)
                self.committed = True
            except OSError as exc:
                raise self._roll_back(
                    exc, verb, root, {rel: changes[rel][0] for rel in written}, old_record if saved else None
                ) from None

    def _roll_back(
        self, exc: OSError, verb: str, root: Path, before: dict[str, Optional[bytes]], old_record: Optional[Record]
    ) -> PatchkitError:
        """Put back the bytes ``before`` of each file written (None: remove
        it and the folders it made), the state (``old_record``, where the new
        one was saved) and no journal; the line that says so."""
        try:
            for rel, old in reversed(before.items()):
                path = tree.inside(root, rel)
                remove_temp_files(path)
                if old is None or file_sha(path, root) != sha256(old):
                    write_or_remove(root, rel, old)
            if old_record is not None:
                self.save(old_record)
            remove_temp_files(self.journal)
            self.journal.unlink(missing_ok=True)
            fsync_dir(self.folder)
        except OSError as again:
            return self._failed(
                exc,
                verb,
                f"rolling it back failed too ({cannot_write(again)}): {self.journal} stays, "
                "and `patchkit revert` will finish it",
            )
        return self._failed(exc, verb, f"rolled back ({len(before)} file(s) restored): nothing was changed")

    @staticmethod
    def _failed(exc: OSError, verb: str, then: str) -> PatchkitError:
        return PatchkitError(f"{cannot_write(exc)}, during {verb}; {then}")

    def pending(self) -> Optional[Pending]:
        """The transaction a killed run left behind, if any."""
        return read_journal(self.journal, self.root)

    def recover(self, verb: str, root: Path, say: Callable[[str], None]) -> None:
        """Settle a transaction a killed run left behind: the same command
        finishes it, the other rolls it back (every file back to its bytes
        before, and the state before). A killed run's temp files of the
        state, the journal and the blobs go first (nothing points at them;
        every writer of those holds the lock, unlike ``.gitignore``'s)."""
        for path in (self.folder / "state.json", self.journal, self.folder / "cache.json"):
            remove_temp_files(path)
        remove_all_temp_files(self.blobs)
        pending = self.pending()
        if pending is None:
            return
        forward = pending.verb == verb or pending.old_state is None  # journals of patchkit 0.2.0 only go forward
        side = "after" if forward else "before"
        moved = 0
        paths = [tree.writable(root, entry["file"]) for entry in pending.files]  # all, before any write
        with held_signals(), settling(self.journal, pending.verb):
            for entry, path in zip(pending.files, paths):
                # A kill inside this file's write left its temp file beside it.
                remove_temp_files(path)
                current = file_sha(path, root)
                if current == entry[side]:
                    if current is None:  # a kill between a removal's unlink and its rmdir left the folder
                        write_or_remove(root, entry["file"], None)
                    continue
                if current not in (entry["before"], entry["after"]):
                    raise PatchkitError(
                        f"{path}: changed since an interrupted patchkit {pending.verb}; cannot settle its "
                        f"transaction (restore the file, or run `patchkit revert --recover`: every other file back "
                        "from the backups, this one left as it is)"
                    )
                write_or_remove(root, entry["file"], None if entry[side] is None else self.get_blob(entry[side]))
                moved += 1
            self.save(pending.state if forward or pending.old_state is None else pending.old_state)
            self.journal.unlink()
        done = "finished it" if forward else "rolled it back"
        say(
            f"an interrupted {pending.verb} of {len(pending.files)} files was pending: {done} ({moved} file(s) written)"
        )

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the tree's lock; wait up to ``timeout`` seconds for another run."""
        try:
            self.ensure_folder()
            # Forked workers close their copy: sharing the flock, one that
            # outlived a killed run held the tree (patchkit.lifetimes).
            # O_NOFOLLOW: never a file a link names (refuse_links said so; this is the race's answer).
            fd = lifetimes.close_on_fork(open_owned(self.folder / "lock", os.O_RDWR | os.O_NOFOLLOW))
        except OSError as exc:
            raise PatchkitError(f"{self.folder}: cannot create patchkit state ({exc.strerror})") from None
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise PatchkitError(
                            f"{self.folder / 'lock'}: another patchkit run holds this tree; gave up after {timeout:g}s"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            lifetimes.close(fd)


def _dumps(obj: object) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def file_sha(path: Path, root: Path) -> Optional[str]:
    """The sha256 of ``path``, a file inside ``root`` (None: no such file)."""
    data = tree.read_regular(path, root)
    return None if data is None else sha256(data)


def refuse_links(folder: Path) -> None:
    """``.patchkit`` and everything in it are patchkit's own: real folders
    and regular files, inside the tree. A symbolic link there sent writes
    outside the tree (a linked ``.patchkit`` or ``blobs`` got the state and
    backups; a dangling ``lock`` link made even ``status`` create the file it
    names), a FIFO hung every command: either is refused in one line, before
    anything is read or written."""
    try:
        found = os.lstat(folder).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(found) or not stat.S_ISDIR(found):
        _foreign(folder, "a symbolic link" if stat.S_ISLNK(found) else "not a folder")
    try:
        listing = os.scandir(folder)
    except PermissionError:
        # A folder closed to this user (the 0700 backups, read by another user's
        # status): this process can follow nothing in it, so nothing to refuse.
        return
    with listing as entries:
        for entry in entries:
            if entry.is_symlink():
                _foreign(Path(entry.path), "a symbolic link")
            if entry.is_dir(follow_symlinks=False):
                refuse_links(Path(entry.path))
            elif not entry.is_file(follow_symlinks=False):
                _foreign(Path(entry.path), "neither a file nor a folder")


def _foreign(path: Path, what: str) -> None:
    raise PatchkitError(
        f"{path}: {what}, in patchkit's state folder, which holds only its own folders and files inside "
        "the tree; refused (nothing was changed; put what it stands for in its place, or remove it)"
    )
