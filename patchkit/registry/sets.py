"""Where patch definitions come from: patch sets.

A set is a folder of ``*.toml`` definitions beside the Python modules of
their codemods (``PatchSet``): patchkit's own (``builtin_set``), a folder
named on the command line or in a pyproject (``folder_set``; which
pyproject counts: ``patchkit.registry.config``), or a package an installed distribution names
(``installed_sets``). ``identity`` says when two places are one set.
Which sets a command uses, and the patches they define, is
``patchkit.registry``'s business.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from patchkit.errors import PatchkitError
from patchkit.registry.definitions import OWN_RUNTIME, ExternalRef, RuntimeModule

if TYPE_CHECKING:
    import configparser
    from importlib.resources.abc import Traversable


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
            elif (external := self._external(module_name, class_name)) is not None:
                return external
        raise PatchkitError(
            f"patch {patch_id}: codemod {ref} cannot be loaded: no module {module_name} in "
            f"{'patchkit.codemods' if self.builtin else self.label}"
        )

    def postcondition_ref(self, ref: str, patch_id: str):
        """A reference of a patch's ``postconditions``, checked as codemod
        references are: ``module:Name`` of a module of this set; in
        patchkit's own set, of a module of patchkit (``patchkit.checks.mirror_reads:...``).
        Found without importing it; the class is imported on first use."""
        module_name, sep, name = ref.partition(":")
        if sep and module_name and name:
            if self.builtin:
                top, _, below = module_name.partition(".")
                if top == "patchkit" and below and self._module_source(below, importlib.resources.files("patchkit")):
                    return ref
            elif (external := self._external(module_name, name)) is not None:
                return external
        raise PatchkitError(
            f"patch {patch_id}: postcondition {ref} cannot be loaded: no module {module_name} in "
            f"{'patchkit' if self.builtin else self.label}"
        )

    def _external(self, module_name: str, name: str) -> Optional[ExternalRef]:
        """``module_name:name`` of this set (not patchkit's own), None when the set has no such module."""
        source = self._module_source(module_name)
        if source is None:
            return None
        return ExternalRef(self.package, module_name, name, self.label, hashlib.sha256(source).hexdigest()[:12])

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
                raise PatchkitError(
                    f"patch {patch_id}: runtime module {name!r} is not one of patchkit's "
                    "(patchkit/runtime, patchkit/backends/...)"
                )
            if not self.builtin and self._module_source(parts[0]) is not None:
                raise PatchkitError(
                    f"patch {patch_id}: {self.label} has a module {parts[0]!r}, the name of "
                    "patchkit's own runtime: rename it (a set's runtime modules take other names)"
                )
            return RuntimeModule(name, "patchkit", own, "patchkit", "sglang-patchkit-runtime")
        if self.builtin or self._module_source(name) is None:
            raise PatchkitError(
                f"patch {patch_id}: runtime module {name!r} is neither one of patchkit's "
                f"({', '.join(OWN_RUNTIME)}) nor a module of {self.label}"
            )
        return RuntimeModule(
            name, self.label, self.folder, self.package if self.distribution else None, self.distribution or ""
        )

    def _module_source(self, module_name: str, folder: Optional["Traversable"] = None) -> Optional[bytes]:
        """The source of ``module_name`` (a module or a package) of this set
        (or of ``folder``)."""
        *parents, last = module_name.split(".")
        folder = folder or self.folder
        for candidate in (folder.joinpath(*parents, last + ".py"), folder.joinpath(*parents, last, "__init__.py")):
            if candidate.is_file():
                return candidate.read_bytes()
        return None


def builtin_set() -> PatchSet:
    """patchkit's own set: the definitions that belong with this code. Run
    from a source checkout (a ``pyproject.toml`` and ``patches/`` beside
    ``patchkit/``), the checkout's own ``patches/``: never those an editable
    install of another checkout maps ``patchkit.patches`` to, nor none when
    it was never installed. Installed, the ``patchkit.patches`` package."""
    root = Path(__file__).resolve().parents[2]  # the checkout, when run from one
    folder: Traversable
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


def installed_sets() -> list[PatchSet]:
    """Sets that installed distributions declare in the ``patchkit.patches``
    entry-point group: ``name = "package"``, the package holding the set."""
    out = []
    for name, module, dist in sorted(_entry_points(ENTRY_POINT_GROUP)):
        label = f"{name} (entry point of {dist})"
        try:
            folder = importlib.resources.files(module)
        except Exception as exc:  # noqa: BLE001 - a broken install: one line naming it
            raise PatchkitError(
                f"patch set {label}: {module!r} cannot be imported ({type(exc).__name__}: {exc})"
            ) from None
        out.append(PatchSet(label, folder, module, distribution=dist))
    return out


def _entry_points(group: str) -> list[tuple[str, str, str]]:
    """(name, module, distribution) of each entry point in ``group``, read from
    the ``entry_points.txt`` of the distributions on ``sys.path`` (the first of
    a name wins, as for ``importlib.metadata``). Read directly: importing
    ``importlib.metadata`` (the email package and more) cost every command
    about 11 ms and its scan 8 ms more, for a group only patch sets use."""

    out, seen = [], set()
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        for info in names:
            key = re.sub(r"[-_.]+", "-", info.rsplit(".", 1)[0].split("-")[0]).lower()
            if key in seen:
                continue
            seen.add(key)
            folder = os.path.join(entry or ".", info)
            try:
                with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if f"[{group}]" not in text:
                continue
            parser = _case_keeping_parser()
            parser.read_string(text)
            dist = _distribution_name(folder) or key
            out += [(name, _module_of(value), dist) for name, value in parser.items(group)]
    return out


def _case_keeping_parser() -> "configparser.ConfigParser":
    """A parser of entry_points.txt: entry point names keep their case."""
    import configparser

    class Parser(configparser.ConfigParser):
        def optionxform(self, optionstr: str) -> str:
            return optionstr

    return Parser(delimiters=("=",), interpolation=None)


def _module_of(value: str) -> str:
    """The module an entry point's value names (``module:attr [extras]``)."""
    match = re.match(r"\s*([\w.]*)", value)
    return match.group(1) if match else ""  # never "": every part of the pattern is optional


def _distribution_name(folder: str) -> Optional[str]:
    """The ``Name:`` of a dist-info's METADATA (an egg-info's PKG-INFO)."""
    for meta in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, meta), encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


def identity(patch_set: PatchSet) -> set:
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
