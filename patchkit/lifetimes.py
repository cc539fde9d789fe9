"""No process outlives the command, and no worker holds the command's locks.

- ``die_with_parent(parent)``: called first in every worker process; the
  worker is SIGKILLed when its parent dies (Linux: the parent-death signal,
  ``prctl(PR_SET_PDEATHSIG)``; elsewhere a thread that watches the parent).
  A ``kill -9`` of patchkit otherwise left its workers running under PID 1,
  for minutes (issue 54).
- ``close_on_fork(fd)``: a lock's descriptor that forked children close at
  once. patchkit's locks are ``flock`` locks, which belong to the open file
  description: a fork shares it (close-on-exec only covers ``exec``), and the
  lock stays held while any process has it open, so an orphaned worker held
  the tree's lock forever. The child only *closes* its copy (``LOCK_UN``
  there would release the parent's lock too).
- ``owned_folder(prefix)``: a temporary folder that says whether its owner is
  alive (it holds a lock on it), so that the next run removes what a killed
  one left (``remove_stale``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_CLOSE_ON_FORK: set[int] = set()
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
OWNER = ".owner"  # written in an owned folder once its owner holds the folder's lock


def _close_in_child() -> None:
    for fd in list(_CLOSE_ON_FORK):
        with contextlib.suppress(OSError):
            os.close(fd)
    _CLOSE_ON_FORK.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def close_on_fork(fd: int) -> int:
    """``fd`` (a lock's descriptor, opened close-on-exec as Python opens every
    file) is closed in every process forked from now on, until ``close(fd)``."""
    _CLOSE_ON_FORK.add(fd)
    return fd


def close(fd: int) -> None:
    _CLOSE_ON_FORK.discard(fd)
    os.close(fd)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` (its parent's pid when it was
    forked) dies. The signal follows the thread that forked it: patchkit
    starts its pools from the thread that uses them. A parent that died
    before the signal was set is seen at once (the process was reparented)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl")
        except (OSError, AttributeError):
            _watch(parent)
    else:
        _watch(parent)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _watch(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="patchkit-parent-watch", daemon=True).start()


def in_child_process() -> dict:
    """``subprocess`` arguments that make the child die with this process
    (where ``preexec_fn`` is safe: Linux, with the parent-death signal)."""
    if not sys.platform.startswith("linux"):
        return {}
    parent = os.getpid()
    return {"preexec_fn": lambda: die_with_parent(parent)}


def _lock(fd: int, wait: bool) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


@contextlib.contextmanager
def owned_folder(prefix: str, where: str | None = None) -> Iterator[Path]:
    """A new temporary folder ``<where>/<prefix>XXXX`` (``where``: the system's
    temporary folder), locked by this process while the block runs, and
    removed after it. First removes the folders of that prefix whose owner
    died (``remove_stale``)."""
    where = where or tempfile.gettempdir()
    remove_stale(prefix, where)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    fd = close_on_fork(os.open(folder, os.O_RDONLY))
    try:
        _lock(fd, wait=True)  # waits only while a ``remove_stale`` looks at it
        (folder / OWNER).write_text(f"{os.getpid()}\n")
        yield folder
    finally:
        close(fd)
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale(prefix: str, where: str) -> list[Path]:
    """Remove the folders ``<where>/<prefix>*`` that ``owned_folder`` made for
    a process that is gone (its lock is free and its owner file written: a
    folder without one is still being set up, or not ours). The removed ones."""
    removed = []
    for folder in Path(where).glob(f"{prefix}*"):
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            if _lock(fd, wait=False) and (folder / OWNER).is_file():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed
