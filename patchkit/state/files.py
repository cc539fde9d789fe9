"""How patchkit writes one file: by rename, inside the package, and the
fault injection the crash and write-fault tests drive.

Every byte patchkit writes into a tree or its ``.patchkit/`` goes through
``atomic_write`` (a temp file beside the target, fsync, rename), and every
file it removes through ``write_or_remove``: the two places a write can fail,
so the two places a test makes it fail (``fault_point``).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from patchkit.tree import folders_of, writable

TEMP_SUFFIX = ".patchkit-tmp"


def atomic_write(path: Path, data: bytes, sync_folder: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file in the same folder, fsync,
    rename. Readers see the old or the new file, never a mix. The file keeps
    its mode and owner; a new one gets the umask's mode and its folder's
    owner (``Ownership``). A kill between the two leaves the temp file (see
    ``remove_temp_files``); a failure (disk full, permission) removes it and
    raises the ``OSError``. ``sync_folder`` False: the caller fsyncs the
    folder (once for many files)."""
    ownership = Ownership.of(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fault_point("write", path)  # half written, as a disk that fills up leaves it
            fh.write(data[len(data) // 2 :])
            fh.flush()
            os.fsync(fh.fileno())
            ownership.give(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a full disk's write or fsync names no file: the line must
        raise
    if sync_folder:
        fsync_dir(path.parent)


@dataclass(frozen=True)
class Ownership:
    """The mode and owner a file patchkit writes gets. A file it replaces
    keeps its own exactly (the temp file it is renamed from would be 0600 and
    the writer's); a new one gets what the tree's own files would get: the
    mode ``open`` gives under this process's umask, and the owner of the
    folder it lands in. Only root can give a file away (``chown``); anyone
    else's files are their own anyway."""

    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, path: Path) -> "Ownership":
        try:
            st = path.stat()
            return cls(st.st_mode & 0o7777, st.st_uid, st.st_gid)
        except FileNotFoundError:
            return cls.new_in(path.parent)

    @classmethod
    def new_in(cls, folder: Path) -> "Ownership":
        st = folder.stat()
        return cls(0o666 & ~umask(), st.st_uid, st.st_gid)

    def give(self, fd: int) -> None:
        if os.geteuid() == 0:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != (self.uid, self.gid):
                os.fchown(fd, self.uid, self.gid)
        os.fchmod(fd, self.mode)  # after chown, which clears set-id bits


def open_owned(path: Path, flags: int) -> int:
    """``os.open`` that gives a file it creates what ``atomic_write`` gives a new one."""
    made = not path.exists()
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    if made:
        Ownership.new_in(path.parent).give(fd)
    return fd


def make_folders(folder: Path, private: bool = False) -> None:
    """``folder`` and the folders above it that are missing, each owned as
    its parent is (root patching another user's tree leaves them that user's);
    their mode is what ``mkdir`` gives under the umask, or 0700 for a
    ``private`` ``folder`` (the backups: copies of files that may be closed
    to others, never opened wider)."""
    if folder.is_dir():
        return
    make_folders(folder.parent)
    with contextlib.suppress(FileExistsError):  # two runs may create it at once
        folder.mkdir(0o700 if private else 0o777)
        if os.geteuid() == 0:
            parent = folder.parent.stat()
            os.chown(folder, parent.st_uid, parent.st_gid)


def umask() -> int:
    """This process's umask: from /proc where Linux has it (setting it to
    read it back, the only other way, races other threads' file creation)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as fh:
            return int(next(line for line in fh if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def remove_temp_files(path: Path) -> None:
    """Remove the temp files a killed ``atomic_write`` of ``path`` left beside
    it (they hold bytes patchkit was writing, never the user's)."""
    with contextlib.suppress(OSError):
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*{TEMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)


def remove_all_temp_files(folder: Path) -> None:
    """Remove every temp file a killed ``atomic_write`` left in ``folder``
    (patchkit's own: ``.patchkit/``, its ``blobs/``)."""
    with contextlib.suppress(OSError):
        for tmp in folder.glob(f".*{TEMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)


def fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove(path: Path) -> None:
    """Remove one of patchkit's own files (the journal); a failure raises the ``OSError``."""
    fault_point("remove", path)
    path.unlink()


def write_or_remove(root: Path, rel: str, data: Optional[bytes], sync_folder: bool = True) -> None:
    """Write a file (creating its folders), or remove it and the folders it
    leaves empty (with the bytecode Python cached there), up to ``root`` and
    never above it (``patchkit.tree``)."""
    path = writable(root, rel)
    if data is not None:
        make_folders(path.parent)
        atomic_write(path, data, sync_folder)
        return
    fault_point("remove", path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    for folder in folders_of(root, rel):
        if folder.is_symlink():  # the user's link (inside the tree): neither removed nor followed
            break
        if not folder.is_dir():  # removed already (by an earlier removal, or a run a kill cut short)
            continue
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


# -- fault injection (tests only) ---------------------------------------------------


def _reached(variable: str, label: str) -> Optional[str]:
    """Whether the point ``label`` is the one ``variable`` names (``label``,
    ``label:N`` for its N-th pass in this process, ``label:N+`` for that pass
    and every later one, ``label:N:EXTRA``); its EXTRA part ("" where none)
    when it is."""
    target = os.environ.get(variable)
    if not target:
        return None
    name, _, rest = target.partition(":")
    nth, _, extra = rest.partition(":")
    if name != label:
        return None
    counter = f"_PATCHKIT_{variable}_COUNT_{label}"
    count = int(os.environ.get(counter, "0")) + 1
    os.environ[counter] = str(count)
    if nth.endswith("+"):
        return extra if count >= int(nth[:-1]) else None
    return None if nth and int(nth) != count else extra


def crash_point(label: str) -> None:
    """Fault injection for the crash-safety tests only. ``PATCHKIT_TEST_CRASH_AT``
    names a point (``label`` or ``label:N`` for its N-th pass); reaching it kills
    the process as SIGKILL would, without cleanup. ``PATCHKIT_TEST_SIGNAL_AT``
    (``label:N:SIGTERM``) sends the process that signal there instead."""
    if _reached("PATCHKIT_TEST_CRASH_AT", label) is not None:
        os._exit(137)
    signame = _reached("PATCHKIT_TEST_SIGNAL_AT", label)
    if signame:
        os.kill(os.getpid(), getattr(signal, signame))


def fault_point(label: str, path: Path) -> None:
    """Fault injection for the write-fault tests only. ``PATCHKIT_TEST_FAIL_AT``
    (``write:N:ENOSPC``, ``remove:N:EACCES``) makes the N-th file write (of
    any file, in this process: blobs, journal, tree files, state) or removal
    fail with that errno, as a full disk or a permission would; ``write:N+``
    fails that one and every later one (a rollback that cannot write either)."""
    name = _reached("PATCHKIT_TEST_FAIL_AT", label)
    if name is not None:
        code = getattr(errno, name or "ENOSPC")
        raise OSError(code, os.strerror(code), str(path))
