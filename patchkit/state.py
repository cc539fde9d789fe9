"""What patchkit remembers about a tree, in ``<package>/.patchkit``.

- ``state.json``: which patches are applied, and per touched file the sha256 of
  its original and patched bytes.
- ``blobs/<sha256>``: content-addressed bytes (originals for exact revert,
  patched versions for 3-way merges with user edits, staged writes).
- ``journal.json``: present only while a transaction writes files. A later
  command that finds it rolls the transaction forward (every blob it needs is
  stored before the journal is written) and says so.
- ``lock``: serialises patchkit processes on one tree.
- ``cache.json``: detection results keyed by codemod and file sha256, so
  ``status`` and ``verify`` need not parse files that did not change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from patchkit.errors import PatchkitError

STATE_FORMAT = 1


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file in the same folder, fsync,
    rename. Readers see the old or the new file, never a mix. Keeps the mode."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".patchkit-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def crash_point(label: str) -> None:
    """Fault injection for the crash-safety tests only: ``PATCHKIT_TEST_CRASH_AT``
    names a point (``label`` or ``label:N`` for its N-th pass); reaching it kills
    the process as SIGKILL would, without cleanup."""
    target = os.environ.get("PATCHKIT_TEST_CRASH_AT")
    if not target:
        return
    name, _, nth = target.partition(":")
    if name != label:
        return
    counter = f"_PATCHKIT_CRASH_COUNT_{label}"
    count = int(os.environ.get(counter, "0")) + 1
    os.environ[counter] = str(count)
    if not nth or int(nth) == count:
        os._exit(137)


class Store:
    """The ``.patchkit`` folder of one tree."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.blobs = folder / "blobs"

    def ensure_folder(self) -> None:
        # exist_ok: two runs may create it at once, before either holds the lock.
        self.folder.mkdir(parents=True, exist_ok=True)
        ignore = self.folder / ".gitignore"
        if not ignore.exists():
            # Keep patchkit's state out of the fork's git status.
            ignore.write_text("*\n")

    # -- blobs ---------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        digest = sha256(data)
        path = self.blobs / digest
        if not path.exists():
            self.blobs.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        return digest

    def has_blob(self, digest: str) -> bool:
        return (self.blobs / digest).is_file()

    def get_blob(self, digest: str) -> bytes:
        path = self.blobs / digest
        try:
            data = path.read_bytes()
        except OSError:
            raise PatchkitError(f"{path}: backup missing; .patchkit state is damaged") from None
        if sha256(data) != digest:
            raise PatchkitError(f"{path}: backup corrupt (sha256 mismatch); .patchkit state is damaged")
        return data

    # -- state ---------------------------------------------------------------

    def has_state(self) -> bool:
        return (self.folder / "state.json").exists()

    def load(self) -> dict:
        path = self.folder / "state.json"
        if not path.exists():
            return {"format": STATE_FORMAT, "applied": {}, "files": {}}
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            fmt = state["format"]
            state["applied"], state["files"]  # noqa: B018 - shape check
        except (ValueError, KeyError, TypeError):
            raise PatchkitError(f"{path}: corrupt patchkit state (not the expected JSON)") from None
        if fmt > STATE_FORMAT:
            raise PatchkitError(f"{path}: written by a newer patchkit (state format {fmt}); upgrade patchkit")
        return state

    def save(self, state: dict) -> None:
        self.ensure_folder()
        atomic_write(self.folder / "state.json", _dumps(state))

    # -- detection cache -----------------------------------------------------

    def load_cache(self, key: str) -> dict:
        try:
            data = json.loads((self.folder / "cache.json").read_text(encoding="utf-8"))
            return data["entries"] if data.get("key") == key else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def save_cache(self, key: str, entries: dict) -> None:
        with contextlib.suppress(OSError):
            self.ensure_folder()
            atomic_write(self.folder / "cache.json", _dumps({"key": key, "entries": entries}))

    # -- transactions --------------------------------------------------------

    @property
    def journal(self) -> Path:
        return self.folder / "journal.json"

    def commit(self, root: Path, writes: dict[str, Optional[bytes]], before: dict[str, Optional[str]],
               state: dict) -> None:
        """Write files and the new state as one transaction.

        writes: relpath -> new bytes (None: remove the file); before: relpath ->
        sha256 expected on disk (None: the file does not exist yet).
        """
        self.ensure_folder()
        entries = [{"file": rel, "before": before[rel], "after": None if data is None else self.put_blob(data)}
                   for rel, data in writes.items()]
        atomic_write(self.journal, _dumps({"files": entries, "state": state}))
        crash_point("journal")
        for entry in entries:
            _write_or_remove(root, entry["file"], writes[entry["file"]])
            crash_point("file")
        self.save(state)
        crash_point("state")
        self.journal.unlink()

    def recover(self, root: Path, say: Callable[[str], None]) -> None:
        """Finish a transaction a killed process left behind."""
        if not self.journal.exists():
            return
        try:
            journal = json.loads(self.journal.read_text(encoding="utf-8"))
            entries, state = journal["files"], journal["state"]
        except (OSError, ValueError, KeyError, TypeError):
            raise PatchkitError(f"{self.journal}: corrupt transaction journal; inspect it, then remove it") from None
        finished = 0
        for entry in entries:
            path = root / entry["file"]
            current = sha256(path.read_bytes()) if path.exists() else None
            if current == entry["after"]:
                continue
            if current != entry["before"]:
                raise PatchkitError(
                    f"{path}: changed since an interrupted patchkit run; cannot finish its transaction "
                    f"({self.journal})"
                )
            _write_or_remove(root, entry["file"], None if entry["after"] is None else self.get_blob(entry["after"]))
            finished += 1
        self.save(state)
        self.journal.unlink()
        say(f"recovered an interrupted patchkit run: finished its transaction ({finished} of {len(entries)} files were pending)")

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the tree's lock; wait up to ``timeout`` seconds for another run."""
        try:
            self.ensure_folder()
            fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
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
            os.close(fd)


def _write_or_remove(root: Path, rel: str, data: Optional[bytes]) -> None:
    """Write a file (creating its folders), or remove it and the folders it
    leaves empty (with the bytecode Python cached there), up to ``root``."""
    path = root / rel
    if data is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    folder = path.parent
    while folder != root and root in folder.parents:
        cache = folder / "__pycache__"
        others = [c for c in folder.iterdir() if c.name != "__pycache__"]
        if not others and cache.is_dir() and all(f.suffix == ".pyc" for f in cache.iterdir()):
            for f in cache.iterdir():
                f.unlink()
            cache.rmdir()
        try:
            folder.rmdir()
        except OSError:  # not empty: something else lives there
            break
        folder = folder.parent


def _dumps(obj: object) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def file_sha(path: Path) -> Optional[str]:
    try:
        return sha256(path.read_bytes())
    except FileNotFoundError:
        return None
