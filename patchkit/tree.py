"""Find the sglang package inside whatever folder the user pointed at.

Accepted layouts: a git checkout (``ROOT/python/sglang``), its ``python/``
folder, the ``sglang/`` package folder itself, or an installed
``site-packages/sglang``. patchkit state always lives next to the package's
files (``<package>/.patchkit``), so every layout of one tree sees the same state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import PatchkitError

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

    def path(self, relpath: str) -> Path:
        return self.package / relpath

    def repo_path(self, relpath: str) -> str:
        """Path as it appears in an upstream checkout (for diffs and patches)."""
        return f"python/sglang/{relpath}"


def _is_package(path: Path) -> bool:
    return path.name == "sglang" and (path / "__init__.py").is_file() and (path / _MARKER).is_file()


def find_tree(given: str | Path) -> Tree:
    path = Path(given)
    if not path.exists():
        raise PatchkitError(f"{given}: no such file or folder")
    if not path.is_dir():
        raise PatchkitError(f"{given}: not a folder (expected an sglang tree)")
    path = path.resolve()
    for layout, package in (
        ("package", path),
        ("python", path / "sglang"),
        ("checkout", path / "python" / "sglang"),
    ):
        if _is_package(package):
            return Tree(given=path, package=package, layout=layout, version=_read_version(package))
    raise PatchkitError(
        f"{given}: not an sglang tree (looked for sglang/{_MARKER}, "
        f"python/sglang/{_MARKER} and {_MARKER} under a folder named sglang)"
    )


def _read_version(package: Path) -> str:
    for candidate in (package / "_version.py", package / "version.py"):
        if candidate.is_file():
            found = _VERSION_RE.search(candidate.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(1)
    pyproject = package.parent / "pyproject.toml"
    if pyproject.is_file():
        found = _PYPROJECT_RE.search(pyproject.read_text(encoding="utf-8", errors="replace"))
        if found:
            return found.group(1)
    return "unknown"
