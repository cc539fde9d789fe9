"""The few questions patchkit asks git about the repository a tree lives in.

Every call degrades to None / False where git is not installed or the tree is
not in a repository: git is a source of facts here, never a requirement.
"""

from __future__ import annotations

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
