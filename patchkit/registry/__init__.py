"""The registry: one declarative TOML file per patch, from patch sets.

patchkit's own set is ``patches/``, installed as the ``patchkit.patches``
package (see pyproject.toml); its codemod references (``module:Class``)
resolve under ``patchkit.codemods``. A vendor keeps patches of their own in
their own repository, as a *patch set*: a folder of ``*.toml`` definitions
beside the Python modules of their codemods, where a reference
``module:Class`` names ``module.py`` of that folder. patchkit finds sets

- named on the command line (``patchkit --patches DIR``, repeatable),
- listed in a ``pyproject.toml`` of the tree's repository
  (``[tool.patchkit] patches = ["path", ...]``, relative to that file),
  loaded by ``apply`` and ``revert`` only (``patchkit.registry.config``),
- installed: a distribution's entry point in the ``patchkit.patches`` group
  names a package, which holds the definitions and codemod modules the same way.

Ids are one namespace: a set reached twice (installed and named, say) is
one set; an id two different sets define is refused, naming both places,
by the commands that use patches (``list`` shows both).
A set's ``runtime = [...]`` may name modules of the set itself (runtime
helpers the patched code imports, vendored beside patchkit's own): their
names are one namespace too.

This module is the registry itself: which sets a command uses, the patches
they define, in dependency order, and the checks across sets. What a patch
is lives in ``patchkit.registry.definitions``; what a set is, in ``patchkit.registry.sets``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from patchkit.errors import PatchkitError
from patchkit.registry import config, definitions
from patchkit.registry.definitions import Patch, Target
from patchkit.registry.sets import PatchSet, builtin_set, folder_set, identity, installed_sets
from patchkit.tree import relative

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from patchkit.tree import Tree


def _parse(text: str, source: str, patch_set: Optional[PatchSet] = None) -> Patch:
    patch_set = patch_set or builtin_set()
    try:
        data = tomllib.loads(text)
        pid = data["id"]
        targets = tuple(
            Target(
                file=relative(t["file"], source),  # a vendor's set names files inside the package only
                codemods=tuple(patch_set.ref(ref, pid) for ref in t["codemods"]),
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
            runtime=tuple(patch_set.runtime_module(name, pid) for name in data.get("runtime", [])),
            origin=patch_set.label,
            postconditions=tuple(patch_set.postcondition_ref(ref, pid) for ref in _references(data, source)),
            summary=_text(data, "summary", source),
            proven_on=_text(data, "proven_on", source),
        )
    except tomllib.TOMLDecodeError as exc:
        raise PatchkitError(f"{source}: not valid TOML ({exc})") from None
    except KeyError as exc:
        raise PatchkitError(f"{source}: a patch definition needs {exc.args[0]!r}") from None


def _text(data: dict, key: str, source: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise PatchkitError(f"{source}: {key} must be a string")
    return value


def _references(data: dict, source: str) -> list[str]:
    """A definition's ``postconditions``: a list of ``module:Name`` strings."""
    refs = data.get("postconditions", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise PatchkitError(f'{source}: postconditions must be a list of "module:Name" references')
    return refs


# The engine, the commands and their tests load codemods as
# ``registry.load_codemod`` / ``registry.codemod_name``.
codemod_name = definitions.codemod_name
load_codemod = definitions.load_codemod

_FOLDERS: list[tuple[Path, str]] = []  # (folder, how it was named), in the order given


def use_folders(folders: Iterable[str | Path], how: str) -> None:
    """Add folders of patch definitions (``--patches``, a pyproject); the
    registry is read again on next use."""
    known = {f for f, _ in _FOLDERS}
    for folder in folders:
        path = Path(folder).expanduser().resolve()
        if path not in known:
            _FOLDERS.append((path, how))
            known.add(path)
            _forget()


def reset() -> None:
    """Back to patchkit's own set and the installed ones (each command starts
    there: one process may run several, as tests and long-lived callers do)."""
    if _FOLDERS:
        _FOLDERS.clear()
        _forget()


def _forget() -> None:
    """Read the definitions again on next use."""
    load.cache_clear()


def use_config(tree: "Tree", load: bool) -> Optional[str]:
    """The sets the ``[tool.patchkit]`` of TREE's repository names
    (``patchkit.registry.config``): loaded where ``load`` (apply, revert) and
    the repository is trusted; else the line that says they are there, and
    how to load them."""
    try:
        found = config.find(tree)
    except PatchkitError as exc:
        if load:
            raise
        return f"note: {exc} (read commands do not load a config's patch sets)"
    if found is None:
        return None
    if load and found.distrust is None:
        use_folders(found.loadable(), str(found.path))
        return None
    return found.unloaded_line()


def patch_sets() -> list[PatchSet]:
    """patchkit's own set, the installed ones, then folders in the order named.
    A set reached twice (installed and named by ``--patches`` or a pyproject;
    one folder named twice; a copy of the same files) is one set: the first
    place it is reached from (patchkit, then installed, then folders) names it."""
    sets = [builtin_set(), *installed_sets(), *(folder_set(f, how) for f, how in _FOLDERS)]
    if len(sets) == 1:
        return sets
    out: list[PatchSet] = []
    seen: set = set()
    for patch_set in sets:
        same = identity(patch_set)
        if seen & same:
            continue
        seen |= same
        out.append(patch_set)
    return out


@dataclass(frozen=True)
class Loaded:
    """The patches of every set: ``patches`` in dependency order (of an id
    two sets define, the first definition); ``clashes``: the other
    definitions; ``problems``: why commands cannot use the registry (one
    line each, naming both sources)."""

    patches: tuple[Patch, ...]
    clashes: tuple[Patch, ...] = ()
    problems: tuple[str, ...] = ()


def _source(patch_set: PatchSet, definition: "Traversable") -> str:
    """Where a definition is, for messages: patches/NAME for patchkit's own,
    else its file, and the set's label where that is not the folder."""
    if patch_set.builtin:
        return f"patches/{definition.name}"
    path = str(definition)
    return path if path.startswith(patch_set.label) else f"{path} [from {patch_set.label}]"


@lru_cache(maxsize=1)
def load() -> Loaded:
    """Every set's patches, with the ids two different sets define set
    aside (``list`` shows them; ``all_patches`` refuses them)."""
    patches: dict[str, Patch] = {}
    sources: dict[str, str] = {}
    clashes: list[Patch] = []
    problems: list[str] = []
    for patch_set in patch_sets():
        for f in patch_set.definitions():
            where = f"patches/{f.name}" if patch_set.builtin else f"{patch_set.label}/{f.name}"
            patch = _parse(f.read_text(encoding="utf-8"), where, patch_set)
            source = _source(patch_set, f)
            if patch.id in patches:
                clashes.append(patch)
                problems.append(
                    f"patch {patch.id} is defined twice, by two different patch sets: in "
                    f"{sources[patch.id]} and in {source} (ids must be unique: rename one, or load "
                    "one of the sets)"
                )
                continue
            patches[patch.id] = patch
            sources[patch.id] = source
    problems += _runtime_name_clashes(patches.values())
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
    return Loaded(tuple(ordered), tuple(clashes), tuple(problems))


def all_patches() -> tuple[Patch, ...]:
    """Every patch, ordered so that a patch comes after those it requires.
    Two different sets that define one id (or one runtime module) are
    refused here, by the commands that use patches: one line naming both."""
    loaded = load()
    if loaded.problems:
        raise PatchkitError(loaded.problems[0])
    return loaded.patches


def _runtime_name_clashes(patches: Iterable[Patch]) -> list[str]:
    """Every set's runtime modules land in one folder of the tree
    (``sglang.srt._patchkit``): a top-level name two sets define is refused."""
    owner: dict[str, str] = {}
    problems = []
    for patch in patches:
        for module in patch.runtime:
            top = module.name.split(".")[0]
            if owner.setdefault(top, module.origin) != module.origin:
                problems.append(
                    f"runtime module {top} is defined twice: in {owner[top]} and in "
                    f"{module.origin} (both would be sglang.srt._patchkit.{top}: rename one)"
                )
    return problems


def by_id(pid: str) -> Patch:
    for patch in all_patches():
        if patch.id == pid:
            return patch
    known = ", ".join(p.id for p in all_patches())
    raise PatchkitError(f"unknown patch {pid!r} (known: {known})")


def select(ids: Iterable[str], skip: Iterable[str] = (), cascade: bool = False) -> list[Patch]:
    """The named patches plus everything they require, in dependency order;
    all patches when none is named. ``skip`` drops patches by name, and with
    ``cascade`` every selected patch that requires one of them; without it, a
    selected patch requiring a skipped one is an error naming all of them."""
    ids = list(ids)
    skip = {by_id(s).id for s in skip}
    wanted = {by_id(i).id for i in ids} if ids else {p.id for p in all_patches()}
    changed = True
    while changed:
        changed = False
        for patch in all_patches():
            if patch.id in wanted:
                for req in patch.requires:
                    if req not in wanted:
                        wanted.add(req)
                        changed = True
    blocked = [d for s in sorted(skip) for d in dependents(s) if d in wanted and d not in skip]
    if blocked and cascade:
        skip |= set(blocked)
    elif blocked:
        named, unique = " ".join(f"--skip {s}" for s in sorted(skip)), list(dict.fromkeys(blocked))
        raise PatchkitError(
            f"{_and(unique)} {'requires' if len(unique) == 1 else 'require'} what {named} excludes: "
            f"`{named} --cascade` leaves them out too (the other patches still apply)"
        )
    return [p for p in all_patches() if p.id in wanted and p.id not in skip]


def dependents(pid: str) -> list[str]:
    """Every patch that requires ``pid``, directly or through another, in patch order."""
    found = {pid}
    changed = True
    while changed:
        changed = False
        for patch in all_patches():
            if patch.id not in found and found.intersection(patch.requires):
                found.add(patch.id)
                changed = True
    return [p.id for p in all_patches() if p.id in found and p.id != pid]


def skip_advice(pid: str) -> str:
    """The one command-line option that leaves ``pid`` out and still applies: with
    ``--cascade`` where other patches require it (every one named, at once)."""
    deps = dependents(pid)
    if not deps:
        return f"`--skip {pid}` (the other patches still apply)"
    return f"`--skip {pid} --cascade` (which also leaves out {_and(deps)}, as they require it; the others still apply)"


def _and(ids: list[str]) -> str:
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]
