"""A user's edits to a file patchkit wrote: carried through, never dropped.

Both directions use ``git merge-file`` with what patchkit wrote as the base:
apply carries edits made since an earlier apply onto the backup (so a later
revert keeps them), revert carries them onto the reverted text.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from patchkit.errors import PatchkitError
from patchkit.tree import sha256

MARKER = 40  # conflict markers longer than any line a source file is likely to hold


def three_way_merge(ours: bytes, base: bytes, theirs: bytes, favor: str = "") -> tuple[bytes, bool]:
    """``git merge-file``: git's own 3-way merge, the one vendors already trust.
    ``favor`` "theirs": a conflicting hunk takes ``theirs``'s side, every
    other hunk of either side is merged as usual (``--theirs``)."""
    if shutil.which("git") is None:
        raise PatchkitError("git is needed to keep edits made after apply (3-way merge), and it is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(tmp) / name
            p.write_bytes(data)
            paths.append(str(p))
        options = [
            f"--marker-size={MARKER}",
            "--diff3",
            "-L",
            "ours",
            "-L",
            "base",
            "-L",
            "theirs",
            *([f"--{favor}"] if favor else []),
        ]
        proc = subprocess.run(["git", "merge-file", "-p", *options, *paths], capture_output=True)
    if proc.returncode < 0 or proc.returncode > 127:
        raise PatchkitError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout, proc.returncode == 0


def conflicts(merged: bytes) -> list[tuple[int, int]]:
    """The conflicts of a merge's output with its (diff3) markers: (the line
    at which the ``theirs`` side stands in the file ``--theirs`` resolves it
    to, how many lines ``ours`` changed or added there, against the base)."""
    found: list[tuple[int, int]] = []
    line, start, side = 0, 0, None
    sides: dict[str, list[bytes]] = {}
    for text in merged.splitlines():
        if side is None and text.startswith(b"<" * MARKER + b" ours"):
            side, sides, start = "ours", {"ours": [], "base": []}, line + 1
        elif side == "ours" and text.startswith(b"|" * MARKER + b" base"):
            side = "base"
        elif side == "base" and text == b"=" * MARKER:
            side = "theirs"
        elif side == "theirs" and text.startswith(b">" * MARKER + b" theirs"):
            side = None
            matcher = difflib.SequenceMatcher(a=sides["base"], b=sides["ours"], autojunk=False)
            found.append((start, sum(j2 - j1 for op, _, _, j1, j2 in matcher.get_opcodes() if op != "equal")))
        elif side in ("ours", "base"):
            sides[side].append(text)
        else:
            line += 1
    return found


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


class Merged(NamedTuple):
    """A reverted file with the user's edits: its bytes, the line that says
    what became of the edits, and the copies to keep (a blob by sha256)."""

    data: bytes
    message: str
    blobs: dict[str, bytes]


def keep_user_edits(path: Path, current: bytes, patched: bytes, target: bytes, force: bool) -> Merged:
    """Revert over a file edited since apply (``current``, where patchkit
    wrote ``patched``): ``target`` (the reverted text) with the user's edits,
    or, where they overlap the patch, an error (with ``force``: ``target``
    with the edits that do not overlap, the edited file kept as a blob and
    the dropped lines named)."""
    merged, clean = three_way_merge(current, patched, target)
    if clean:
        return Merged(merged, f"{path}: kept your edits made after apply (3-way merge)", {})
    if force:
        # Hunk by hunk: only the edits that overlap the patch go; the rest stay.
        forced, _ = three_way_merge(current, patched, target, favor="theirs")
        where = "; ".join(f"{dropped} line(s) of yours at line {at}" for at, dropped in conflicts(merged))
        digest = sha256(current)
        return Merged(
            forced,
            f"{path}: --force discarded your edits that overlap the patch ({where} of the "
            f"reverted file) and kept the others; your whole copy: .patchkit/blobs/{digest}",
            {digest: current},
        )
    raise PatchkitError(
        f"{path}: edited after apply and the edits overlap the patch; nothing was reverted "
        "(resolve by hand, or pass --force to discard the edits)"
    )
