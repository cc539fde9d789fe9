"""The few questions patchkit asks git about the repository a tree lives in.

Every call degrades to None / False where git is not installed or the tree is
not in a repository: git is a source of facts here, never a requirement.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Optional


def run(cwd: Path, *args: str) -> Optional[bytes]:
    """``git ARGS`` in ``cwd``: its stdout, or None when it fails."""
    if shutil.which("git") is None or not cwd.is_dir():
        return None
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


def toplevel(path: Path) -> Optional[Path]:
    out = run(path, "rev-parse", "--show-toplevel")
    return Path(out.decode().strip()) if out else None


def head(path: Path) -> Optional[str]:
    """The commit checked out in the repository holding ``path``."""
    out = run(path, "rev-parse", "--verify", "-q", "HEAD")
    return out.decode().strip() if out else None


def is_shallow(path: Path) -> bool:
    """A ``--depth`` clone, whose history stops short (most CI checkouts)."""
    out = run(path, "rev-parse", "--is-shallow-repository")
    return out is not None and out.strip() == b"true"


def version_in_history(path: Path, digest: str) -> Optional[bytes]:
    """A version of ``path`` with this sha256 in the history of its repository
    (every version of that path in any ref)."""
    root = toplevel(path.parent)
    if root is None:
        return None
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None
    log = run(root, "log", "--all", "--format=", "--raw", "--no-abbrev", "--no-renames", "--", rel)
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
        data = run(root, "cat-file", "blob", blob)
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            return data
    return None
