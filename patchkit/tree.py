"""Find the sglang package inside whatever folder the user pointed at.

Accepted layouts: a git checkout (``ROOT/python/sglang``), its ``python/``
folder, the ``sglang/`` package folder itself (or a copy of it under
another name that keeps its version file), or an installed
``site-packages/sglang``, named by that folder or any folder inside it (found
upward, as git finds ``.git``); with no TREE, the current folder. patchkit
state always lives next to the package's files (``<package>/.patchkit``), so
every layout of one tree sees the same state.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Optional

from patchkit.errors import PatchkitError


def sha256(data: bytes) -> str:
    """A file's identity everywhere in patchkit: state, caches, backups."""
    return hashlib.sha256(data).hexdigest()


_MARKER = Path("srt") / "layers" / "attention" / "base_attn_backend.py"
_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
_PYPROJECT_RE = re.compile(r"""^version\s*=\s*['"]([^'"]+)['"]""", re.M)


@dataclass(frozen=True)
class Tree:
    given: Path  # what the user passed
    package: Path  # the sglang package folder
    layout: str  # checkout | python | package
    version: str

    @property
    def state_dir(self) -> Path:
        return self.package / ".patchkit"

    @property
    def release(self) -> Optional[str]:
        """The sglang release whose bytes the tree is compared with (``base_release``)."""
        return base_release(self.version)

    def path(self, relpath: str) -> Path:
        """A file of the package, which it never leaves (``inside``)."""
        return inside(self.package, relpath)

    def read(self, relpath: str) -> Optional[bytes]:
        """The bytes of a file of the package (``read_regular``); None where there is none."""
        return read_regular(self.path(relpath), self.package)

    def repo_path(self, relpath: str) -> str:
        """Path as it appears in an upstream checkout (for diffs and patches)."""
        return f"python/sglang/{relpath}"

    def shown_path(self, relpath: str, given: str | None = None, base: str | None = None) -> str:
        """``relpath`` (relative to the package) as a path from the tree
        argument exactly as the user typed it (``given``; default: the folder
        the tree was found at), e.g. ``python/sglang/srt/...`` for the checkout
        root ``.``, so editors and CI annotations find it; an absolute one
        under ``base`` (default: the working directory) is made relative to it."""
        given = str(self.given) if given is None else given
        joined = os.path.normpath(os.path.join(given, os.path.relpath(self.package, self.given), relpath))
        if os.path.isabs(joined):
            root = os.path.abspath(base or os.getcwd())
            if joined == root or joined.startswith(root.rstrip(os.sep) + os.sep):
                return quoted(os.path.relpath(joined, root))
        return quoted(joined)

    def github_path(self, relpath: str, given: str | None = None) -> str:
        """``shown_path`` for GitHub annotations, which are resolved against
        the repository root ($GITHUB_WORKSPACE) when there is one."""
        workspace = os.environ.get("GITHUB_WORKSPACE")
        if workspace:
            absolute = os.path.abspath(os.path.join(self.package, relpath))
            root = os.path.abspath(workspace)
            if absolute.startswith(root.rstrip(os.sep) + os.sep):
                return quoted(os.path.relpath(absolute, root))
        return self.shown_path(relpath, given)


_CONTROL = re.compile(r'[\x00-\x1f\x7f"\\]')
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def quoted(path: str) -> str:
    """``path`` as printed: as it is, or where it holds a control character
    (a newline), in double quotes with C escapes, as git quotes it. A module
    named ``x\n::error ...`` printed a line that GitHub Actions runs as a
    workflow command."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in path):
        return path
    return '"' + _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\{ord(m.group()):03o}"), path) + '"'


def holds_package(path: Path) -> bool:
    """Does ``path`` hold an sglang package (``__init__.py`` and the marker
    file), whatever its name: a tree, or a copy of one nested in a tree."""
    return (path / "__init__.py").is_file() and (path / _MARKER).is_file()


def _is_package(path: Path, named: bool = True) -> bool:
    """An sglang package folder (``holds_package``); named ``sglang``, or
    (``named`` False: a copy the user renamed) with a version file of its
    own (``_version.py`` / ``version.py``)."""
    if not holds_package(path):
        return False
    return path.name == "sglang" or (not named and _own_version(path) is not None)


def _layouts(path: Path):
    yield "package", path
    yield "python", path / "sglang"
    yield "checkout", path / "python" / "sglang"


def _at(path: Path) -> Tree | None:
    for layout, package in _layouts(path):
        if _is_package(package, named=layout != "package"):
            return Tree(given=path, package=package, layout=layout, version=_read_version(package))
    return None


def find_tree(given: str | Path) -> Tree:
    """The tree at ``given`` or, as git finds ``.git``, at the nearest folder
    above it that is one: a subfolder of the package (``python/sglang/srt``) or
    of a checkout (``ROOT/docs``) names the tree it is in. ``Tree.given`` is
    the folder where the tree was found."""
    path = Path(given)
    if not path.exists():
        raise PatchkitError(f"{given}: no such file or folder")
    if not path.is_dir():
        raise PatchkitError(f"{given}: not a folder (expected an sglang tree)")
    path = path.resolve()
    for folder in (path, *path.parents):
        found = _at(folder)
        if found is not None:
            return found
    raise PatchkitError(
        f"{given}: not an sglang tree, nor inside one (looked here and in every folder above for an sglang "
        f"package, a folder holding __init__.py and {_MARKER} that is named sglang or has its own "
        f"_version.py, as the folder itself, its sglang/ or its python/sglang/)"
    )


def locate(given: str | None) -> tuple[str, Tree, bool]:
    """The tree a command works on: ``given`` (a path as typed), or the
    current folder when None. Returns the found folder as the user would type
    it (``given`` itself, else relative to the current folder, or absolute when
    ``given`` was), the tree, and whether it was found somewhere other than
    exactly where ``given`` points (so the command says which tree it took)."""
    start = "." if given is None else given
    try:
        tree = find_tree(start)
    except PatchkitError as exc:
        if given is None:
            raise PatchkitError(
                f"{Path.cwd()}: no TREE given, and the current folder is {str(exc).split(': ', 1)[1]}"
            ) from None
        raise
    if given is not None and tree.given == Path(given).resolve():
        return given, tree, False
    shown = str(tree.given) if Path(start).is_absolute() else os.path.relpath(tree.given)
    return shown, tree, True


def _own_version(package: Path) -> str | None:
    """The version the package's own version file states, if any."""
    for candidate in (package / "_version.py", package / "version.py"):
        data = read_regular(candidate, package)
        found = None if data is None else _VERSION_RE.search(data.decode("utf-8", errors="replace"))
        if found:
            return found.group(1)
    return None


def _read_version(package: Path) -> str:
    own = _own_version(package)
    if own is not None:
        return own
    pyproject = read_regular(package.parent / "pyproject.toml", package.parent)
    found = None if pyproject is None else _PYPROJECT_RE.search(pyproject.decode("utf-8", errors="replace"))
    if found:
        return found.group(1)
    return "unknown"


def check_writable(tree: Tree, files: Iterable[str]) -> None:
    """Stop before any write if one of ``files`` cannot be written (``unwritable``)."""
    why = unwritable(tree, files)
    if why:
        raise PatchkitError(f"{why} (nothing was changed)")


def unwritable(tree: Tree, files: Iterable[str]) -> Optional[str]:
    """Why one of ``files`` cannot be written (None: all can): the file, or,
    for a file to create, the nearest folder that exists. Mode bits count
    too: root may write anything, but a file the user marked read-only is not
    ours to replace (os.replace would). Nor is a symlink (``writable``)."""
    for rel in files:
        path = writable(tree.package, rel)
        nodes = [("file", path)] if path.exists() else []
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        for what, node in (*nodes, ("folder", folder)):
            if not os.access(node, os.W_OK) or not node.stat().st_mode & stat.S_IWUSR:
                return f"{node}: read-only {what}, cannot write {path.name}"
    return None


# A PEP 440 public version (``0.5.11``, ``0.5.12.post1``, ``0.5.0rc2``, ``1!2.0.dev3``) and
# an optional local segment (``+acme``, ``+cu124.acme-2``): a fork's build of that release.
_PEP440 = re.compile(
    r"^(?P<public>(?:\d+!)?\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?$",
    re.IGNORECASE,
)


def base_release(version: str) -> str | None:
    """The sglang release a version string names: itself, or for a PEP 440
    local version (``0.5.11+acme``, a fork's build) its public part
    (``0.5.11``), the release whose bytes the vendor-code check compares
    with; None when it names no release (``unknown``, ``acme-main``)."""
    found = _PEP440.match(version or "")
    return found.group("public") if found else None


# --- paths inside the package -------------------------------------------------
# The one rule for paths inside a tree: they stay inside the sglang package.
#
# Every path patchkit reads from a file (the tracked manifest, ``state.json``,
# the journal, a patch set's ``[[targets]] file``) is untrusted: a clone or a
# vendor's folder may carry any text. The sources check its spelling when they
# parse it (``relative``, ``digest``: they name the file that said it), and
# ``Tree.path`` / the transaction resolve it against the package (``inside``,
# ``writable``) before anything is read, written or removed. A violation is a
# ``PatchkitError``: one line, exit 2, found before the first write.
#
# - A path is relative, in ``/`` form, without ``..``, without an empty part,
#   and never under ``.patchkit/`` (patchkit's own state, never a tree file).
# - Resolved (every symlink that exists followed), it lies inside the package:
#   a symlinked folder may point elsewhere in the tree, never out of it.
# - A file patchkit writes or removes is never itself a symlink: patchkit
#   replaces files by rename, which would turn the link into a plain file that
#   revert cannot give back; such a file is refused, whatever it points at.
# - A blob is named by a sha256 (64 hex digits), never by a path.

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


def digest(value: object, where: str) -> str | None:
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


# --- reading a file of the tree ----------------------------------------------------
# Every file patchkit reads from a tree (its modules, the manifest, the
# version file, ``.patchkit/``'s state, journal and blobs) is read by
# ``read_regular``: a module symlinked to /dev/zero or to a file outside the
# tree, or a FIFO where a module or state.json belongs, is refused in one line
# (it was read, or hung every command).

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def read_regular(path: Path, root: Path) -> Optional[bytes]:
    """The bytes of ``path``, a regular file inside ``root`` (every symlink
    on the way followed, it stays inside); None where there is no such file.
    Anything else is refused in one line, before it is opened (a FIFO would
    block, a device never end); the open does not block either, and the
    file opened is checked again (it may have been swapped meanwhile)."""
    real, top = path.resolve(), root.resolve()
    if real != top and top not in real.parents:
        raise PatchkitError(
            f"{path}: leads out of {root} (through a symlink, to {real}); patchkit reads nothing "
            "outside the tree: refused (nothing was changed)"
        )
    try:
        return _open_regular(path, os.stat(real).st_mode, real, 0)
    except FileNotFoundError:
        return None


def read_walked(path: str, root: Path) -> Optional[bytes]:
    """``read_regular`` for a file a walk of ``root`` found (``os.walk``,
    which enters no folder link): only a link of its own is resolved (a
    thousand modules' ``resolve`` cost the audit a quarter of a second)."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            return read_regular(Path(path), root)
        return _open_regular(path, mode, path, os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # O_NONBLOCK: a FIFO swapped in never blocks


def _open_regular(path: str | Path, mode: int, real: str | Path, flags: int) -> bytes:
    """The bytes of ``real`` (``path`` resolved, of ``mode``), a regular file;
    checked again once open (it may have been swapped meanwhile)."""
    _regular(path, mode)
    with open(os.open(real, _READ | flags), "rb") as handle:
        _regular(path, os.fstat(handle.fileno()).st_mode)
        return handle.read()


def _regular(path: str | Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise PatchkitError(
            f"{path}: {kind}, where patchkit expects a regular file; it reads only regular files: "
            "refused (nothing was changed)"
        )
