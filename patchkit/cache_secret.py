"""What makes an entry of the transform cache patchkit's own: a secret.

The cache decides bytes that land in a tree (a transform's output) and the
verdicts ``status``, ``verify`` and the audit give. A plain sha256 over an
entry only finds damage: anyone who can write the cache can recompute it
(issue 68: a poisoned entry was written into a tree and ``verify`` said OK).
So every entry carries an HMAC-SHA256 under a secret of the cache's own,
``secret`` in its folder: 32 random bytes, made on first use, mode 0600.

The secret is believed only when it is a regular file of the user running
patchkit that no one else may read; otherwise (another user's cache, a
secret made readable) the cache is not used at all, which only costs speed.
Whoever can read the secret can forge entries: the cache trusts its owner,
and nothing it holds is shared with another user.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import os
import stat
from pathlib import Path
from typing import Optional

SIZE = 32


def seal(folder: Path, data: bytes) -> Optional[str]:
    """The HMAC of ``data`` under the secret of the cache in ``folder``; None
    where the cache has no secret it may believe (the entry is not written)."""
    key = _secret(folder)
    return None if key is None else hmac.new(key, data, "sha256").hexdigest()


def sealed(folder: Path, data: bytes, mac: object) -> bool:
    """``mac`` is the seal of ``data``: an entry this cache's owner wrote."""
    expected = seal(folder, data)
    return expected is not None and isinstance(mac, str) and hmac.compare_digest(expected, mac)


@functools.cache
def _secret(folder: Path) -> Optional[bytes]:
    from patchkit import settings

    path = folder / "secret"
    with contextlib.suppress(OSError):
        if not path.exists():
            settings.make_cache_folder(folder)
            _make(path)
        return _read(path)
    return None


def _make(path: Path) -> None:
    """Written whole under a temporary name, then linked into place: two
    runs that make it at once both read the one that won."""
    tmp = path.with_name(f".secret.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.urandom(SIZE))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink()


def _read(path: Path) -> Optional[bytes]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # another user's, or readable by others: not this user's secret
        key = os.read(fd, SIZE + 1)
    finally:
        os.close(fd)
    return key if len(key) == SIZE else None
