"""What a patch is: its definition (``Patch``), the files it changes
(``Target``), the runtime modules it needs in the tree (``RuntimeModule``),
and the codemod references its targets name (``module:Class`` of patchkit's
own set, ``ExternalRef`` of another set), loaded on first use, as are the
references of the checks it declares (``patchkit.postconditions``).

Plain values with no knowledge of where definitions come from
(``patchkit.registry.sets``) or of the registry that reads them
(``patchkit.registry``): ``vendoring`` and the commands' reports use them
without reading any patch set.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from patchkit.errors import PatchkitError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from patchkit.codemods.common.base import PatchCodemod


_REMOVED_IN = re.compile(r"removed upstream in (\d+(?:\.\d+)*)")


def _numbers(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``0.5.12.post1`` -> (0, 5, 12)), for ordering releases."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split(".post")[0].split("+")[0])[:3])


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

    def why_missing(self, release: Optional[str]) -> str:
        """Why the file is not in a tree of ``release`` (its base release, None
        when it names none): ``when_missing`` where that tells this tree's
        story, and "not in this tree" where it cannot (a release from before
        the one ``when_missing`` says removed it never had the file)."""
        removed = _REMOVED_IN.match(self.when_missing)
        if not self.when_missing or (removed and (release is None or _numbers(release) < _numbers(removed.group(1)))):
            return "not in this tree"
        return self.when_missing

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
    # patchkit.state.vendoring: patchkit's own or the patch's set's.
    runtime: tuple["RuntimeModule", ...] = ()
    # The set the definition came from (``PatchSet.label``): "patchkit" for
    # patchkit's own, else the folder or the entry point.
    origin: str = "patchkit"
    # Checks that must hold on the tree the patch leaves (``patchkit.postconditions``):
    # ``module:Name`` of a module of patchkit for its own set, ``ExternalRef`` of another set.
    postconditions: tuple = ()
    # One line each for the patch table (``patchkit list --format markdown``, the README's):
    # what it changes, and where it was proven (a GPU, or "CPU only").
    summary: str = ""
    proven_on: str = ""

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


_LOADED: dict[str, type] = {}  # codemod classes, by name
_POSTCONDITIONS: dict[str, object] = {}  # what postcondition references name, by reference


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


def _import(module: str, name: str, what: str) -> Any:  # whatever the module holds under that name
    """``name`` of ``module``, imported; ``what`` names it in the one-line error."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:  # noqa: BLE001 - a vendor's module may fail any way: one line
        raise PatchkitError(f"{what} cannot be loaded: {type(exc).__name__}: {exc}") from None


def _load_external(ref: ExternalRef) -> type:
    key = ref.name()
    codemod = _LOADED.get(key)
    if codemod is None:
        found = _import(f"{ref.package}.{ref.module}", ref.cls, f"codemod {ref.module}:{ref.cls} of {ref.label}")
        # Reports and caches know a codemod by name(): the loaded class answers
        # with its reference's name, never a bare module.Class that could be
        # one of patchkit's own.
        codemod = _LOADED[key] = type(
            found.__name__, (found,), {"name": classmethod(lambda cls: key), "__module__": found.__module__}
        )
    return codemod


def load_postcondition(ref) -> object:
    """What a patch's ``postconditions`` reference names (``module:Name`` of
    patchkit, or an ``ExternalRef``), imported on first use; the commands
    check that it is a ``patchkit.postconditions.Postcondition``."""
    if isinstance(ref, ExternalRef):
        key, module, name = ref.name(), f"{ref.package}.{ref.module}", ref.cls
        what = f"postcondition {ref.module}:{ref.cls} of {ref.label}"
    else:
        key, (module, _, name), what = ref, ref.partition(":"), f"postcondition {ref}"
    found = _POSTCONDITIONS.get(key)
    if found is None:
        found = _POSTCONDITIONS[key] = _import(module, name, what)
    return found
