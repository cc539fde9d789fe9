"""The patch registry: one declarative TOML file per patch in ``patches/``.

``patches/`` is installed as the ``patchkit.patches`` package (see
pyproject.toml), so the definitions ship with patchkit. A patch names its
upstream PRs, the patches it requires, and per target file the codemods
(``module:Class`` under ``patchkit.codemods``) that carry it.
"""

from __future__ import annotations

import importlib
import importlib.resources
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

from patchkit.codemods.base import PatchCodemod
from patchkit.errors import PatchkitError


@dataclass(frozen=True)
class Target:
    file: str  # relative to the sglang package folder
    codemods: tuple[type[PatchCodemod], ...]
    optional: bool = False  # a file some releases lack: that part is not applicable there
    when_missing: str = ""  # why it may be missing


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


def _load_codemod(ref: str, patch_id: str) -> type[PatchCodemod]:
    module_name, _, class_name = ref.partition(":")
    try:
        module = importlib.import_module(f"patchkit.codemods.{module_name}")
        codemod = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        raise PatchkitError(f"patch {patch_id}: codemod {ref} cannot be loaded: {exc}") from None
    return codemod


def _parse(text: str, source: str) -> Patch:
    data = tomllib.loads(text)
    pid = data["id"]
    targets = tuple(
        Target(
            file=t["file"],
            codemods=tuple(_load_codemod(ref, pid) for ref in t["codemods"]),
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


@lru_cache(maxsize=1)
def all_patches() -> tuple[Patch, ...]:
    """Every patch, ordered so that a patch comes after those it requires."""
    files = sorted(
        (f for f in importlib.resources.files("patchkit.patches").iterdir() if f.name.endswith(".toml")),
        key=lambda f: f.name,
    )
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
