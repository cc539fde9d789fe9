"""The registry: one declarative TOML file per patch, from patch sets.

patchkit's own set is ``patches/``, installed as the ``patchkit.patches``
package (see pyproject.toml); its codemod references (``module:Class``)
resolve under ``patchkit.codemods``. A vendor keeps patches of their own in
their own repository, as a *patch set*: a folder of ``*.toml`` definitions
beside the Python modules of their codemods, where a reference
``module:Class`` names ``module.py`` of that folder. patchkit finds sets

- named on the command line (``patchkit --patches DIR``, repeatable),
- listed in a ``pyproject.toml`` above the tree or the current folder
  (``[tool.patchkit] patches = ["path", ...]``, relative to that file),
- installed: a distribution's entry point in the ``patchkit.patches`` group
  names a package, which holds the definitions and codemod modules the same way.

Ids are one namespace: a set reached twice (installed and named, say) is
one set; an id two different sets define is refused, naming both places,
by the commands that use patches (``list`` shows both).
A set's ``runtime = [...]`` may name modules of the set itself (runtime
helpers the patched code imports, vendored beside patchkit's own): their
names are one namespace too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import importlib.util
import sys
import tomllib
import types
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
    # Runtime modules the patched code imports, written into the tree by
    # patchkit.vendoring: patchkit's own or the patch's set's.
    runtime: tuple["RuntimeModule", ...] = ()
    # The set the definition came from (``PatchSet.label``): "patchkit" for
    # patchkit's own, else the folder or the entry point.
    origin: str = "patchkit"

    @property
    def files(self) -> list[str]:
        return [t.file for t in self.targets]


# patchkit's own runtime modules: these folder names under patchkit/ (and under
# the tree's sglang.srt._patchkit) are patchkit's; a set's own modules take others.
OWN_RUNTIME = ("runtime", "backends")


@dataclass(frozen=True)
class RuntimeModule:
    """A runtime module a patch needs in the tree, as ``sglang.srt._patchkit.<name>``.

    ``name`` is dotted below ``root``, the folder its source is read from
    (``runtime``, ``backends.fa3`` under patchkit/; ``acme_runtime`` in a
    vendor's set). Package mode imports ``<package>.<name>`` instead, from
    the distribution ``install`` names; a set given as a folder has no
    package (``package`` None): a serving process cannot import it."""

    name: str
    origin: str  # the set's label: "patchkit" for patchkit's own
    root: "Traversable" = field(compare=False)
    package: Optional[str] = None
    install: str = ""

    @property
    def own(self) -> bool:
        return self.origin == "patchkit"


@dataclass(frozen=True)
class ExternalRef:
    """A codemod of a set outside patchkit: ``module:Class`` of the import
    package ``package`` (a registered folder or an installed package).

    A plain value (a fork-started worker receives it pickled). Its name
    carries the set and a digest of the module's source, so the per-tree
    detection cache, keyed by name and file bytes, never answers for an
    edited codemod; and it is not a ``str``, so the shared transform cache
    (whose fingerprint covers patchkit's own code only) leaves it alone."""

    package: str
    module: str
    cls: str
    label: str
    digest: str

    def name(self) -> str:
        return f"{self.label}:{self.module}.{self.cls}@{self.digest}"


def codemod_name(ref) -> str:
    """``module.Class`` (as ``PatchCodemod.name()``) of a class or a ``module:Class`` reference."""
    if isinstance(ref, str):
        return ref.replace(":", ".", 1)
    return ref.name()


_LOADED: dict[str, type] = {}


def load_codemod(ref) -> "type[PatchCodemod]":
    """The codemod class of a reference (or a class, returned as it is), imported on first use."""
    if isinstance(ref, ExternalRef):
        return _load_external(ref)
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


def _load_external(ref: ExternalRef) -> type:
    key = ref.name()
    codemod = _LOADED.get(key)
    if codemod is None:
        try:
            found = getattr(importlib.import_module(f"{ref.package}.{ref.module}"), ref.cls)
        except Exception as exc:  # noqa: BLE001 - a vendor's module may fail any way: one line
            raise PatchkitError(f"codemod {ref.module}:{ref.cls} of {ref.label} cannot be loaded: "
                                f"{type(exc).__name__}: {exc}") from None
        # Reports and caches know a codemod by name(): the loaded class answers
        # with its reference's name, never a bare module.Class that could be
        # one of patchkit's own.
        codemod = _LOADED[key] = type(found.__name__, (found,), {"name": classmethod(lambda cls: key),
                                                                "__module__": found.__module__})
    return codemod


@dataclass(frozen=True)
class PatchSet:
    """Where patch definitions come from. ``folder`` holds the ``*.toml``;
    ``package`` is the import package their ``module:Class`` references
    resolve under; ``label`` names the set in ``list`` and in errors."""

    label: str
    folder: "Traversable"
    package: str
    builtin: bool = False
    # The distribution that installs ``package`` (an entry point's), so a
    # patched tree can import the set's runtime modules in package mode.
    distribution: Optional[str] = None

    def definitions(self) -> list["Traversable"]:
        try:
            files = [f for f in self.folder.iterdir() if f.name.endswith(".toml")]
        except OSError as exc:
            raise PatchkitError(f"patch set {self.label}: cannot read it ({exc.strerror or exc})") from None
        return sorted(files, key=lambda f: f.name)

    def ref(self, ref: str, patch_id: str):
        """A reference as written in a patch file, checked: ``module:Class``
        whose module exists in this set (found without importing it; the class
        is imported on first use)."""
        module_name, sep, class_name = ref.partition(":")
        if sep and module_name and class_name:
            if self.builtin:
                if importlib.util.find_spec(f"{self.package}.{module_name}") is not None:
                    return ref
            else:
                source = self._module_source(module_name)
                if source is not None:
                    return ExternalRef(self.package, module_name, class_name, self.label,
                                       hashlib.sha256(source).hexdigest()[:12])
        raise PatchkitError(f"patch {patch_id}: codemod {ref} cannot be loaded: no module {module_name} in "
                            f"{'patchkit.codemods' if self.builtin else self.label}")

    def runtime_module(self, name: str, patch_id: str) -> RuntimeModule:
        """A module named in a patch's ``runtime = [...]``: one of patchkit's
        own (``runtime``, ``backends.x``) or, for a set outside patchkit, a
        module of the set (``name.py`` or a package ``name/`` in its folder)."""
        parts = name.split(".")
        own = importlib.resources.files("patchkit")
        if not all(p.isidentifier() and not p.startswith("_") for p in parts):
            raise PatchkitError(f"patch {patch_id}: runtime module {name!r} is not a dotted module name")
        if parts[0] in OWN_RUNTIME:
            if self._module_source(name, own) is None:
                raise PatchkitError(f"patch {patch_id}: runtime module {name!r} is not one of patchkit's "
                                    "(patchkit/runtime, patchkit/backends/...)")
            if not self.builtin and self._module_source(parts[0]) is not None:
                raise PatchkitError(f"patch {patch_id}: {self.label} has a module {parts[0]!r}, the name of "
                                    "patchkit's own runtime: rename it (a set's runtime modules take other names)")
            return RuntimeModule(name, "patchkit", own, "patchkit", "sglang-patchkit-runtime")
        if self.builtin or self._module_source(name) is None:
            raise PatchkitError(f"patch {patch_id}: runtime module {name!r} is neither one of patchkit's "
                                f"({', '.join(OWN_RUNTIME)}) nor a module of {self.label}")
        return RuntimeModule(name, self.label, self.folder, self.package if self.distribution else None,
                             self.distribution or "")

    def _module_source(self, module_name: str, folder: Optional["Traversable"] = None) -> Optional[bytes]:
        """The source of ``module_name`` (a module or a package) of this set
        (or of ``folder``)."""
        *parents, last = module_name.split(".")
        folder = folder or self.folder
        for candidate in (folder.joinpath(*parents, last + ".py"), folder.joinpath(*parents, last, "__init__.py")):
            if candidate.is_file():
                return candidate.read_bytes()
        return None


def _parse(text: str, source: str, patch_set: Optional[PatchSet] = None) -> Patch:
    patch_set = patch_set or builtin_set()
    try:
        data = tomllib.loads(text)
        pid = data["id"]
        targets = tuple(
            Target(
                file=t["file"],
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
        )
    except tomllib.TOMLDecodeError as exc:
        raise PatchkitError(f"{source}: not valid TOML ({exc})") from None
    except KeyError as exc:
        raise PatchkitError(f"{source}: a patch definition needs {exc.args[0]!r}") from None


def builtin_set() -> PatchSet:
    """patchkit's own set: the definitions that belong with this code. Run
    from a source checkout (a ``pyproject.toml`` and ``patches/`` beside
    ``patchkit/``), the checkout's own ``patches/``: never those an editable
    install of another checkout maps ``patchkit.patches`` to, nor none when
    it was never installed. Installed, the ``patchkit.patches`` package."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "patches" / "__init__.py").is_file():
        folder = root / "patches"
    else:
        folder = importlib.resources.files("patchkit.patches")
    return PatchSet("patchkit", folder, "patchkit.codemods", builtin=True)


def definition_files() -> list[Traversable]:
    """patchkit's own ``*.toml`` patch definitions, sorted by name."""
    return builtin_set().definitions()


# --- sets outside patchkit ----------------------------------------------------------

ENTRY_POINT_GROUP = "patchkit.patches"

_FOLDERS: list[tuple[Path, str]] = []  # (folder, how it was named), in the order given


def folder_set(folder: Path, how: str) -> PatchSet:
    """A folder as a set, registered as an import package of its own so its
    codemod modules import one another (``from . import helpers``) and a
    fork-started worker finds them too."""
    if not folder.is_dir():
        raise PatchkitError(f"{how}: {folder}: no such folder of patch definitions")
    package = "_patchkit_set_" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    if package not in sys.modules:
        module = types.ModuleType(package, f"patch set {folder}")
        module.__path__ = [str(folder)]
        sys.modules[package] = module
    return PatchSet(str(folder), folder, package)


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


def pyproject_folders(start: Path) -> tuple[Optional[Path], list[Path]]:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a
    ``[tool.patchkit]`` table, and the folders its ``patches`` lists."""
    start = start.resolve()
    for folder in (start, *start.parents):
        config = folder / "pyproject.toml"
        if not config.is_file():
            continue
        try:
            data = tomllib.loads(config.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
            raise PatchkitError(f"{config}: cannot read it ({exc})") from None
        table = data.get("tool", {}).get("patchkit")
        if table is None:
            continue
        listed = table.get("patches", [])
        if isinstance(listed, str):
            listed = [listed]
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise PatchkitError(f"{config}: [tool.patchkit] patches must be a list of folders")
        return config, [folder / p for p in listed]
    return None, []


def use_pyproject(start: Path) -> None:
    """The sets the nearest ``[tool.patchkit]`` above ``start`` lists."""
    config, folders = pyproject_folders(start)
    if config is not None:
        use_folders(folders, str(config))


def installed_sets() -> list[PatchSet]:
    """Sets that installed distributions declare in the ``patchkit.patches``
    entry-point group: ``name = "package"``, the package holding the set."""
    from importlib.metadata import entry_points

    out = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        label = f"{ep.name} (entry point of {ep.dist.name})" if ep.dist else f"{ep.name} (entry point)"
        try:
            folder = importlib.resources.files(ep.module)
        except Exception as exc:  # noqa: BLE001 - a broken install: one line naming it
            raise PatchkitError(f"patch set {label}: {ep.value!r} cannot be imported "
                                f"({type(exc).__name__}: {exc})") from None
        out.append(PatchSet(label, folder, ep.module, distribution=ep.dist.name if ep.dist else ep.module))
    return out


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
        identity = _identity(patch_set)
        if seen & identity:
            continue
        seen |= identity
        out.append(patch_set)
    return out


def _identity(patch_set: PatchSet) -> set:
    """What makes two sets one: the same folder, or the same files (names and
    bytes of its definitions and Python modules)."""
    found: set = set()
    try:
        found.add(("folder", Path(str(patch_set.folder)).resolve()))
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    files = 0
    pending = [("", patch_set.folder)]
    try:
        while pending:
            prefix, folder = pending.pop()
            for entry in sorted(folder.iterdir(), key=lambda e: e.name):
                name = f"{prefix}{entry.name}"
                if entry.is_dir():
                    if entry.name != "__pycache__" and not entry.name.startswith(".") and prefix.count("/") < 4:
                        pending.append((name + "/", entry))
                elif entry.name.endswith((".toml", ".py")):
                    data = entry.read_bytes()
                    digest.update(f"{name}\0{len(data)}\0".encode() + data)
                    files += 1
    except OSError:
        return found
    if files:
        found.add(("files", digest.hexdigest()))
    return found


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
                problems.append(f"patch {patch.id} is defined twice, by two different patch sets: in "
                                f"{sources[patch.id]} and in {source} (ids must be unique: rename one, or load "
                                "one of the sets)")
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
                problems.append(f"runtime module {top} is defined twice: in {owner[top]} and in "
                                f"{module.origin} (both would be sglang.srt._patchkit.{top}: rename one)")
    return problems


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
