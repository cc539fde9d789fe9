"""Patch sets a tree's repository names: ``[tool.patchkit] patches = [...]``
in a ``pyproject.toml``.

A patch set is code patchkit imports, and its codemods decide what lands in
the tree; so a config is trusted as git trusts a repository's hooks (issue
68): only the config of TREE's own repository counts, only ``apply`` and
``revert`` load what it names, and only folders inside that repository.
Read commands never import it (they say it is there, and how to load it:
``--patches DIR``). A repository owned by another user loads nothing unless
git's ``safe.directory`` trusts it, the rule git follows for the same reason.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from patchkit import git
from patchkit.errors import PatchkitError
from patchkit.tree import Tree


@dataclass(frozen=True)
class Config:
    path: Path  # the pyproject.toml
    folders: tuple[Path, ...]  # the sets it names, resolved
    repository: Path  # TREE's repository: the folder its config must lie in
    distrust: Optional[str]  # why it may not load (another user's); None: it may

    def loadable(self) -> tuple[Path, ...]:
        """The folders to load for ``apply`` / ``revert``; a folder outside the repository is refused."""
        for folder in self.folders:
            if not folder.is_relative_to(self.repository):
                raise PatchkitError(
                    f"{self.path}: [tool.patchkit] patches names {folder}, outside the repository "
                    f"{self.repository}; a config loads only sets inside it (name another with --patches DIR); "
                    "nothing was changed"
                )
        return self.folders

    def unloaded_line(self) -> str:
        """What a command that does not load it says."""
        named = " ".join(f"--patches {f}" for f in self.folders)
        why = self.distrust or "read commands do not load a config's patch sets"
        return f"note: {self.path} names patch sets ([tool.patchkit] patches); {why}: load them with {named}"


def repository(tree: Tree) -> Path:
    """The git repository holding the tree (the folder with ``.git``), else
    the checkout the package sits in (``ROOT/python/sglang``), else the
    package itself (however the tree was named: from inside it too)."""
    package = tree.package.resolve()
    for folder in (package, *package.parents):
        if (folder / ".git").exists():
            return folder
    return package.parents[1] if package.parent.name == "python" else package


def find(tree: Tree) -> Optional[Config]:
    """The nearest ``pyproject.toml`` with a ``[tool.patchkit]`` table at or
    above the package, up to the tree's repository and never above it."""
    top = repository(tree)
    start = tree.package.resolve()
    for folder in (start, *start.parents):
        if not folder.is_relative_to(top):
            return None
        config = folder / "pyproject.toml"
        if config.is_file() and (listed := _listed(config)) is not None:
            folders = tuple((folder / p).resolve() for p in listed)
            return Config(config, folders, top, _distrust(config, top))
    return None


def _listed(config: Path) -> Optional[list[str]]:
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise PatchkitError(f"{config}: cannot read it ({exc})") from None
    table = data.get("tool", {}).get("patchkit")
    if table is None:
        return None
    listed = table.get("patches", [])
    if isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise PatchkitError(f"{config}: [tool.patchkit] patches must be a list of folders")
    return listed


def _distrust(config: Path, top: Path) -> Optional[str]:
    """Why a config of another user's repository does not load (git's ``safe.directory`` rule)."""
    me = os.geteuid()
    other = next((uid for uid in (top.stat().st_uid, config.stat().st_uid) if uid != me), None)
    if other is None or _safe_directory(top):
        return None
    return (
        f"{top} is owned by uid {other}, not by you (uid {me}), and git's safe.directory does not name it "
        f"(git config --global --add safe.directory {top})"
    )


def _safe_directory(top: Path) -> bool:
    out = git.run(Path("/"), "config", "--get-all", "safe.directory")
    for value in (out or b"").decode(errors="replace").splitlines():
        value = value.strip()
        if value == "*":
            return True
        with contextlib.suppress(RuntimeError):  # ~user of no such user: names nothing
            if value.endswith("/*") and top.is_relative_to(Path(value[:-2]).expanduser()):
                return True
            if value and Path(value).expanduser().resolve() == top:
                return True
    return False
