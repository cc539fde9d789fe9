"""The one rule for paths inside a tree: they stay inside the sglang package.

Every path patchkit reads from a file (the tracked manifest, ``state.json``,
the journal, a patch set's ``[[targets]] file``) is untrusted: a clone or a
vendor's folder may carry any text. The sources check its spelling when they
parse it (``relative``, ``digest``: they name the file that said it), and
``Tree.path`` / the transaction resolve it against the package (``inside``,
``writable``) before anything is read, written or removed. A violation is a
``PatchkitError``: one line, exit 2, found before the first write.

- A path is relative, in ``/`` form, without ``..``, without an empty part,
  and never under ``.patchkit/`` (patchkit's own state, never a tree file).
- Resolved (every symlink that exists followed), it lies inside the package:
  a symlinked folder may point elsewhere in the tree, never out of it.
- A file patchkit writes or removes is never itself a symlink: patchkit
  replaces files by rename, which would turn the link into a plain file that
  revert cannot give back; such a file is refused, whatever it points at.
- A blob is named by a sha256 (64 hex digits), never by a path.

A leaf: it imports only ``patchkit.errors``.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Optional

from patchkit.errors import PatchkitError

STATE_FOLDER = ".patchkit"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def relative(rel: object, where: str) -> str:
    """``rel`` as ``where`` (the file that named it) gave it, if it is a path
    inside a package; else a one-line refusal."""
    if not isinstance(rel, str):
        raise PatchkitError(f"{where}: names {rel!r} where a file path belongs; refused (nothing was changed)")
    parts = rel.split("/")
    escapes = (
        not rel
        or "\0" in rel
        or "\\" in rel
        or PurePosixPath(rel).is_absolute()
        or bool(PureWindowsPath(rel).drive)
        or any(p in ("", "..") for p in parts)
        or parts[0] == STATE_FOLDER
    )
    if escapes:
        raise PatchkitError(
            f"{where}: names {rel!r}, not a path inside the sglang package "
            "(absolute, through .., or patchkit's own state); refused (nothing was changed)"
        )
    return rel


def digest(value: object, where: str) -> Optional[str]:
    """A blob's name as ``where`` gave it: a sha256, or None (no such file)."""
    return None if value is None else blob_name(value, where)


def blob_name(value: object, where: str) -> str:
    """A blob's name as ``where`` gave it: a sha256, nothing else."""
    if isinstance(value, str) and _DIGEST.fullmatch(value):
        return value
    raise PatchkitError(f"{where}: names {value!r} where a sha256 belongs; refused (nothing was changed)")


def inside(package: Path, rel: str) -> Path:
    """``package / rel``, once it is certain to lie inside ``package`` with
    every symlink on the way followed."""
    path = package / relative(rel, str(package))
    root = package.resolve()
    real = path.resolve()
    if real != root and root not in real.parents:
        raise PatchkitError(
            f"{path}: leads out of the sglang package {package} (through a symlink, to {real}); "
            "refused (nothing was changed)"
        )
    return path


def writable(package: Path, rel: str) -> Path:
    """``inside``, for a file patchkit writes or removes: never a symlink."""
    path = inside(package, rel)
    if path.is_symlink():
        raise PatchkitError(
            f"{path}: a symbolic link; patchkit writes files by rename and would replace the link "
            "by a plain file: refused (nothing was changed; replace the link by the file it "
            "points at, or leave the patch out with --skip)"
        )
    return path


def folders_of(package: Path, rel: str) -> list[Path]:
    """The folders between ``rel`` and ``package``, innermost first: where a
    removal's clean-up may go, and never further (never ``package`` itself)."""
    parts = relative(rel, str(package)).split("/")[:-1]
    return [package.joinpath(*parts[:depth]) for depth in range(len(parts), 0, -1)]
