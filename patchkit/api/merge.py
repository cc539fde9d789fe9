"""A user's edits to a file patchkit wrote: carried through, never dropped.

Both directions use ``git merge-file`` with what patchkit wrote as the base:
apply carries edits made since an earlier apply onto the backup (so a later
revert keeps them), revert carries them onto the reverted text.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from patchkit.errors import PatchkitError

if TYPE_CHECKING:
    from patchkit.api.commit import Outcome


def three_way_merge(ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """``git merge-file``: git's own 3-way merge, the one vendors already trust."""
    if shutil.which("git") is None:
        raise PatchkitError("git is needed to keep edits made after apply (3-way merge), and it is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(tmp) / name
            p.write_bytes(data)
            paths.append(str(p))
        proc = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True)
    if proc.returncode < 0 or proc.returncode > 127:
        raise PatchkitError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout, proc.returncode == 0


def original_with_user_edits(path: Path, current: bytes, patched: bytes, original: bytes) -> bytes:
    """Apply over a file edited since an earlier apply (``current``, where
    patchkit wrote ``patched``): the backup ``original`` with those edits."""
    merged, clean = three_way_merge(current, patched, original)
    if not clean:
        raise PatchkitError(
            f"{path}: edited after an earlier apply, overlapping patched code; "
            "revert (or undo the edits) before applying more patches to it"
        )
    return merged


def keep_user_edits(path: Path, current: bytes, patched: bytes, target: bytes, force: bool,
                    outcome: "Outcome") -> bytes:
    """Revert over a file edited since apply (``current``, where patchkit
    wrote ``patched``): ``target`` (the reverted text) with the user's edits,
    or, where they overlap the patch, an error (with ``force``: ``target``,
    the edited file kept as a blob)."""
    merged, clean = three_way_merge(current, patched, target)
    if clean:
        outcome.messages.append(f"{path}: kept your edits made after apply (3-way merge)")
        return merged
    if force:
        kept = outcome.keep(current)
        outcome.messages.append(f"{path}: your edits conflicted; --force discarded them (copy kept in .patchkit/blobs/{kept})")
        return target
    raise PatchkitError(
        f"{path}: edited after apply and the edits overlap the patch; nothing was reverted "
        "(resolve by hand, or pass --force to discard the edits)"
    )
