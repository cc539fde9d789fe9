"""Find the bytes of a file version patchkit knows only by its sha256.

A clone of a patched fork has the tracked manifest (``srt/_patchkit/manifest.json``)
but not the git-ignored ``.patchkit/`` folder with its backups. To revert
there, each original is looked up, and checked against the recorded sha256:

1. in the fork's git history (every version of that path in any ref), which
   has it when the fork committed the tree before patching it;
2. in the sglang release the tree says it is (the wheel from the package
   registry, cached), which has it for a release patched as shipped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from patchkit import git
from patchkit.errors import EXIT_CHANGES, PatchkitError


class OriginalNotFound(PatchkitError):
    """A revert that cannot be exact is refused (exit 1, nothing changed)."""

    exit_code = EXIT_CHANGES


def from_git_history(path: Path, digest: str) -> Optional[bytes]:
    """A version of ``path`` with this sha256 in the history of its repository."""
    root = git.toplevel(path.parent)
    if root is None:
        return None
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None
    log = git.run(root, "log", "--all", "--format=", "--raw", "--no-abbrev", "--no-renames", "--", rel)
    if not log:
        return None
    blobs: list[str] = []
    for line in log.decode().splitlines():
        # ":100644 100644 <old blob> <new blob> M\tpath"
        fields = line.split("\t", 1)[0].split()
        for blob in fields[2:4] if len(fields) >= 4 else ():
            if blob.strip("0") and blob not in blobs:
                blobs.append(blob)
    for blob in blobs:
        data = git.run(root, "cat-file", "blob", blob)
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            return data
    return None


def from_release(version: str, rel: str, digest: str) -> Optional[bytes]:
    """The file as the sglang ``version`` wheel ships it, if that has this sha256."""
    if not version or version == "unknown":
        return None
    from patchkit.fetch import fetch_tree

    try:
        data = (fetch_tree(version) / rel).read_bytes()
    except (PatchkitError, OSError):
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def find(path: Path, rel: str, digest: str, version: str) -> bytes:
    """The bytes of ``path`` (``rel`` in the sglang ``version`` tree) with this
    sha256, from where a clone can have them, in this order: the checkout's
    git history, the release."""
    data = from_git_history(path, digest)
    if data is None:
        data = from_release(version, rel, digest)
    if data is None and git.is_shallow(path.parent):
        raise PatchkitError(
            f"{path}: cannot restore it exactly: this clone is shallow and the version patchkit recorded "
            f"(sha256 {digest[:12]}) is not in the history it has nor in the sglang {version} release; "
            "`git fetch --unshallow` fetches the rest of the history, then run this again (nothing was changed)"
        )
    if data is None:
        raise OriginalNotFound(
            f"{path}: cannot restore it exactly: the version patchkit recorded (sha256 {digest[:12]}) is "
            f"neither in this checkout's git history nor in the sglang {version} release; nothing was changed"
        )
    return data
