"""The patch registry: one declarative TOML file per patch in ``patches/``.

``patches/`` is installed as the ``patchkit.patches`` package (see
pyproject.toml), so the definitions ship with patchkit. A patch names its
upstream PRs, the patches it requires, and per target file the codemods
(``module:Class`` under ``patchkit.codemods``) that carry it.
"""

from __future__ import annotations

import importlib
import importlib.resources
import importlib.util
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from patchkit.errors import PatchkitError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from patchkit.codemods.base import PatchCodemod


class Target:
    """One target file of a patch and the codemods that change it.

    ``codemods`` may be given as classes or as ``"module:Class"`` references
    (what ``patches/*.toml`` says); references are imported on first use, so
    commands answered from the detection cache (``status``, ``verify``) never
    import the codemod modules, nor libcst."""

    __slots__ = ("file", "refs", "optional", "when_missing", "_loaded")

    def __init__(self, file: str, codemods: Iterable, optional: bool = False, when_missing: str = "") -> None:
        self.file = file  # relative to the sglang package folder
        self.refs: tuple = tuple(codemods)
        self.optional = optional  # a file some releases lack: that part is not applicable there
        self.when_missing = when_missing  # why it may be missing
        self._loaded: Optional[tuple] = None

    @property
    def names(self) -> tuple[str, ...]:
        """``PatchCodemod.name()`` of each codemod, without importing it."""
        return tuple(codemod_name(r) for r in self.refs)

    @property
    def codemods(self) -> tuple["type[PatchCodemod]", ...]:
        if self._loaded is None:
            self._loaded = tuple(load_codemod(r) for r in self.refs)
        return self._loaded

    def _key(self) -> tuple:
        return (self.file, self.names, self.optional, self.when_missing)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Target) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Target({self.file!r}, {self.names!r})"


@dataclass(frozen=True)
class Patch:
    id: str
    title: str
    upstream: tuple[str, ...]
    requires: tuple[str, ...]
    description: str
    targets: tuple[Target, ...] = field(default=())
    # Runtime modules (under patchkit/, dotted: "runtime", "backends.trtllm_mha")
    # the patched code imports; written into the tree by patchkit.vendoring.
    runtime: tuple[str, ...] = ()

    @property
    def files(self) -> list[str]:
        return [t.file for t in self.targets]


def codemod_name(ref) -> str:
    """``module.Class`` (as ``PatchCodemod.name()``) of a class or a ``module:Class`` reference."""
    if isinstance(ref, str):
        return ref.replace(":", ".", 1)
    return ref.name()


_LOADED: dict[str, type] = {}


def load_codemod(ref) -> "type[PatchCodemod]":
    """The codemod class of a ``module:Class`` reference (or ``name()``), imported on first use."""
    if not isinstance(ref, str):
        return ref
    key = codemod_name(ref)
    codemod = _LOADED.get(key)
    if codemod is None:
        module_name, _, class_name = key.rpartition(".")
        try:
            module = importlib.import_module(f"patchkit.codemods.{module_name}")
            codemod = _LOADED[key] = getattr(module, class_name)
        except (ImportError, AttributeError) as exc:
            raise PatchkitError(f"codemod {ref} cannot be loaded: {exc}") from None
    return codemod


def _check_codemod(ref: str, patch_id: str) -> str:
    """A reference as written in a patch file: ``module:Class`` whose module
    exists (found without importing it; the class is imported on first use)."""
    module_name, sep, class_name = ref.partition(":")
    if not sep or not module_name or not class_name or importlib.util.find_spec(f"patchkit.codemods.{module_name}") is None:
        raise PatchkitError(f"patch {patch_id}: codemod {ref} cannot be loaded: no module patchkit.codemods.{module_name}")
    return ref


def _parse(text: str, source: str) -> Patch:
    data = tomllib.loads(text)
    pid = data["id"]
    targets = tuple(
        Target(
            file=t["file"],
            codemods=tuple(_check_codemod(ref, pid) for ref in t["codemods"]),
            optional=t.get("optional", False),
            when_missing=t.get("when_missing", ""),
        )
        for t in data.get("targets", [])
    )
    return Patch(
        id=pid,
        title=data["title"],
        upstream=tuple(data.get("upstream", [])),
        requires=tuple(data.get("requires", [])),
        description=data.get("description", "").strip(),
        targets=targets,
        runtime=tuple(data.get("runtime", [])),
    )


def definition_files() -> list[Traversable]:
    """The ``*.toml`` patch definitions, sorted by name.

    Installed, they are the ``patchkit.patches`` package; run from a source
    checkout that was never installed (``python -m patchkit`` in the repo, or
    ``scripts/gpu_e2e.py`` calling it), that package does not exist and the
    definitions are the repository's own ``patches/`` folder beside ``patchkit/``.
    """
    try:
        folder = importlib.resources.files("patchkit.patches")
    except ModuleNotFoundError:
        folder = Path(__file__).resolve().parent.parent / "patches"
    return sorted((f for f in folder.iterdir() if f.name.endswith(".toml")), key=lambda f: f.name)


@lru_cache(maxsize=1)
def all_patches() -> tuple[Patch, ...]:
    """Every patch, ordered so that a patch comes after those it requires."""
    files = definition_files()
    patches = {p.id: p for p in (_parse(f.read_text(encoding="utf-8"), f.name) for f in files)}
    ordered: list[Patch] = []

    def visit(pid: str, chain: tuple[str, ...]) -> None:
        if pid in chain:
            raise PatchkitError(f"patch requirements form a cycle: {' -> '.join(chain + (pid,))}")
        if any(p.id == pid for p in ordered):
            return
        for req in patches[pid].requires:
            if req not in patches:
                raise PatchkitError(f"patch {pid} requires unknown patch {req}")
            visit(req, chain + (pid,))
        ordered.append(patches[pid])

    for pid in patches:
        visit(pid, ())
    return tuple(ordered)


def get(pid: str) -> Patch:
    for patch in all_patches():
        if patch.id == pid:
            return patch
    known = ", ".join(p.id for p in all_patches())
    raise PatchkitError(f"unknown patch {pid!r} (known: {known})")


def select(ids: Iterable[str], skip: Iterable[str] = ()) -> list[Patch]:
    """The named patches plus everything they require, in dependency order;
    all patches when none is named. ``skip`` drops patches by name (and is an
    error if a selected patch requires a skipped one)."""
    ids = list(ids)
    skip = {get(s).id for s in skip}
    wanted = {get(i).id for i in ids} if ids else {p.id for p in all_patches()}
    changed = True
    while changed:
        changed = False
        for patch in all_patches():
            if patch.id in wanted:
                for req in patch.requires:
                    if req not in wanted:
                        wanted.add(req)
                        changed = True
    for patch in all_patches():
        if patch.id in wanted and patch.id not in skip:
            blocked = [r for r in patch.requires if r in skip]
            if blocked:
                raise PatchkitError(f"patch {patch.id} requires {blocked[0]}, which --skip excludes")
    return [p for p in all_patches() if p.id in wanted and p.id not in skip]


def dependents(pid: str) -> list[Patch]:
    """Patches that require ``pid``, directly or through others."""
    out: list[Patch] = []
    for patch in all_patches():
        if pid in patch.requires or any(d.id in patch.requires for d in out):
            out.append(patch)
    return out
