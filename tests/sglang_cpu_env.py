"""CPU environment for importing real (pristine or patched) sglang trees in tests.

Behaviour tests import sglang modules from a tree on disk, on a machine with no
GPU. With the packages of ``requirements-behaviour.txt`` installed (a CPU torch,
triton and about 25 pure-Python packages) that works, except for two GPU-only
packages that sglang imports at module level:

``torchvision``
    No CPU build exists on the registry we can reach (only CUDA builds that pull
    a CUDA torch). ``sglang.srt.utils.common`` does
    ``from torchvision.io import decode_jpeg`` at import time, so *every*
    ``import sglang...`` needs it. transformers 5.6.0 probes it only with
    ``importlib.util.find_spec("torchvision")`` (``is_torchvision_available``),
    which, for a module already in ``sys.modules``, returns its ``__spec__``
    (and raises ``ValueError`` when ``__spec__`` is None). The stand-in
    therefore carries a real ``ModuleSpec``, a ``__version__`` and
    ``__path__`` (so ``torchvision.transforms.v2.functional`` and friends import
    too). Every other attribute is a :class:`StandIn` placeholder: attribute
    access, hashing and comparison work (sglang and transformers build
    module-level tables such as ``{"bicubic": InterpolationMode.BICUBIC}``),
    but *calling* one raises :class:`StandInCalledError`, so a test that really
    reaches image decoding fails loudly instead of computing garbage.

``sgl_kernel``
    The CUDA kernel package (``sglang-kernel`` wheel, CUDA-only). sglang ships
    ``sglang.test.test_utils.maybe_stub_sgl_kernel()`` for this, and upstream's
    CPU CI uses it; we use that very function. It cannot simply be imported:
    ``sglang.test.test_utils`` imports ``sglang`` (which needs the torchvision
    stand-in first), ``bench_serving``, ``run_eval`` and more, and it would
    import one particular tree before the test chose one. So we read the
    function out of the tree's ``test_utils.py`` with :mod:`ast` and execute
    just that definition. Its stub module answers every attribute with a
    ``MagicMock`` (calls return mocks silently: upstream's choice). When no tree
    is given or the function is missing, an equivalent stand-in of our own
    (raising on call, like the torchvision one) is installed instead.

Both stand-ins are installed only when the real package cannot be imported, so
on a GPU machine with the real packages nothing is faked.

Order matters: install the stand-ins before the first ``import transformers``
(it caches ``is_torchvision_available()``) and before the first ``import sglang``.

Trees: :func:`import_sglang_tree` puts a tree's parent folder first on
``sys.path`` and drops every ``sglang`` module already imported, so that the next
``import sglang.srt...`` loads *that* tree (sglang itself is never installed).
Switching trees inside one process works for the modules tested here (about 3 s
a switch), but module objects and classes of the earlier tree that a test still
holds keep pointing at the old code, and anything keyed by class identity or
registered globally (torch custom ops, ``isinstance`` across trees) cannot be
shared between trees. Group tests by tree, and where isolation matters use one
process per tree (a ``subprocess``, as ``tests/behaviour/test_import_pristine.py``
does for the other releases).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "StandIn",
    "StandInCalledError",
    "StandInModule",
    "import_sglang_tree",
    "install_import_stubs",
    "install_sgl_kernel_stub",
    "install_torchvision_stand_in",
    "purge_sglang_modules",
    "stubbed_packages",
]

#: Version reported by stand-in modules: valid PEP 440, and obviously not real.
STAND_IN_VERSION = "0.0.0+patchkit.cpu.stand.in"

#: Attribute set to True on every stand-in module (and the marker to look for).
STAND_IN_MARKER = "__patchkit_stand_in__"

#: Packages installed as stand-ins by this process: name -> how.
_STUBBED: dict[str, str] = {}


class StandInCalledError(RuntimeError):
    """A placeholder of a GPU-only package was called on the CPU test machine."""


class StandIn:
    """Placeholder for any attribute of a stand-in module.

    Attribute access returns (cached) nested placeholders, so module-level code
    such as ``InterpolationMode.BICUBIC`` or ``transforms.v2.functional`` runs;
    hashing and equality are by identity. Calling raises
    :class:`StandInCalledError` naming the attribute, and subclassing one
    (``class X(torchvision.Foo)``) yields a class whose instantiation raises.
    """

    __slots__ = ("_children", "_qualname")

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)
        object.__setattr__(self, "_children", {})

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        children = object.__getattribute__(self, "_children")
        if name not in children:
            children[name] = StandIn(f"{self._qualname}.{name}")
        return children[name]

    def __call__(self, *args, **kwargs):
        raise StandInCalledError(
            f"{self._qualname}() was called, but it is an import-time stand-in "
            f"installed by tests/sglang_cpu_env.py: the real "
            f"{self._qualname.split('.')[0]!r} package (GPU-only here) is not installed "
            f"in this CPU test environment."
        )

    def __mro_entries__(self, bases):
        qualname = self._qualname

        def _refuse(cls, *args, **kwargs):
            raise StandInCalledError(
                f"{cls.__name__} subclasses stand-in {qualname}; the real package "
                f"is not installed in this CPU test environment."
            )

        return (type(qualname.rsplit(".", 1)[-1], (), {"__new__": _refuse}),)

    def __repr__(self) -> str:
        return f"<patchkit stand-in {self._qualname}>"

    def __bool__(self) -> bool:
        return True


class StandInModule(types.ModuleType):
    """Module whose unknown attributes are :class:`StandIn` placeholders."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = StandIn(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return StandInModule(spec.name)

    def exec_module(self, module):
        module.__version__ = STAND_IN_VERSION
        setattr(module, STAND_IN_MARKER, True)
        if not module.__doc__:
            module.__doc__ = (
                "Import-time stand-in installed by patchkit's tests/sglang_cpu_env.py; "
                "calling anything in it raises StandInCalledError."
            )


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Resolves ``name`` and ``name.*`` to stand-in packages."""

    def __init__(self, names: Iterable[str]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in self.names:
            return importlib.machinery.ModuleSpec(
                fullname, _StandInLoader(), origin="patchkit-cpu-stand-in", is_package=True
            )
        return None

    def __repr__(self) -> str:
        return f"<patchkit stand-in finder {sorted(self.names)}>"


def _importable(name: str) -> bool:
    """True when the real package imports (not one of our stand-ins)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return not getattr(mod, STAND_IN_MARKER, False)
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001  ImportError, OSError (no CUDA libs), RuntimeError...
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        return False
    return True


def _install_stand_in(name: str) -> None:
    sys.meta_path.insert(0, _StandInFinder([name]))
    importlib.import_module(name)


def _upstream_maybe_stub_sgl_kernel(package_dir: Path):
    """Return sglang's own ``maybe_stub_sgl_kernel`` from a tree, without
    importing ``sglang.test.test_utils`` (see module docstring), or None."""
    source_path = package_dir / "test" / "test_utils.py"
    try:
        tree = ast.parse(source_path.read_text(encoding="utf-8"), str(source_path))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "maybe_stub_sgl_kernel":
            module = ast.Module(body=[node], type_ignores=[])
            namespace: dict = {"sys": sys, "__name__": "sglang_test_utils_extract"}
            exec(compile(module, str(source_path), "exec"), namespace)  # noqa: S102
            return namespace["maybe_stub_sgl_kernel"]
    return None


def install_torchvision_stand_in() -> bool:
    """Install the ``torchvision`` stand-in unless the real one imports.

    Call it before transformers is imported: transformers caches
    ``is_torchvision_available()`` (``functools.lru_cache``), and a cached False
    makes e.g. ``AutoImageProcessor`` raise "requires the Torchvision library".
    If transformers is already imported, its caches are cleared here, which
    covers the availability checks but not decisions taken at its import.
    Returns True when the stand-in is (now) installed.
    """
    if "torchvision" in _STUBBED:
        return True
    if _importable("torchvision"):
        return False
    _install_stand_in("torchvision")
    _STUBBED["torchvision"] = "patchkit stand-in (raises on call)"
    import_utils = sys.modules.get("transformers.utils.import_utils")
    for name in ("is_torchvision_available", "is_torchvision_v2_available"):
        cache_clear = getattr(getattr(import_utils, name, None), "cache_clear", None)
        if cache_clear is not None:
            cache_clear()
    return True


def install_sgl_kernel_stub(package_dir: str | os.PathLike | None = None, *, upstream: bool = True) -> bool:
    """Install an ``sgl_kernel`` stub unless the real one imports.

    ``package_dir`` is an sglang package folder (``.../sglang``) whose
    ``test/test_utils.py`` provides ``maybe_stub_sgl_kernel`` (used when
    ``upstream``); without it, the sglang found on ``sys.path`` (if any). When
    neither is available, or ``upstream=False``, our own stand-in is installed,
    whose attributes raise when called instead of returning mocks (both import
    every tested module of 0.5.10 .. 0.5.13). Must run before the first
    ``import sglang``. Returns True when a stub is (now) installed.
    """
    if "sgl_kernel" in _STUBBED:
        return True
    if _importable("sgl_kernel"):
        return False
    if package_dir is None and "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is not None and spec.origin:
            package_dir = Path(spec.origin).parent
    stub = None
    if upstream and package_dir is not None:
        stub = _upstream_maybe_stub_sgl_kernel(Path(package_dir))
    if stub is not None:
        stub()
        importlib.import_module("sgl_kernel")
        _STUBBED["sgl_kernel"] = "sglang.test.test_utils.maybe_stub_sgl_kernel (MagicMock attributes)"
    else:
        _install_stand_in("sgl_kernel")
        _STUBBED["sgl_kernel"] = "patchkit stand-in (raises on call)"
    return True


def install_import_stubs(
    package_dir: str | os.PathLike | None = None, *, upstream_sgl_kernel: bool = True
) -> dict[str, str]:
    """Install stand-ins for ``torchvision`` and ``sgl_kernel`` where the real
    packages do not import (see :func:`install_torchvision_stand_in` and
    :func:`install_sgl_kernel_stub`). Idempotent; returns
    :func:`stubbed_packages`. Must run before the first ``import sglang``, and
    ideally before the first ``import transformers``.
    """
    install_torchvision_stand_in()
    install_sgl_kernel_stub(package_dir, upstream=upstream_sgl_kernel)
    return dict(_STUBBED)


def stubbed_packages() -> dict[str, str]:
    """Packages this process replaced with stand-ins, and by what."""
    return dict(_STUBBED)


def purge_sglang_modules() -> list[str]:
    """Remove ``sglang`` and all its submodules from ``sys.modules``."""
    names = [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]
    for name in names:
        del sys.modules[name]
    importlib.invalidate_caches()
    return names


def import_sglang_tree(
    package_dir: str | os.PathLike, *, stubs: bool = True, upstream_sgl_kernel: bool = True
) -> types.ModuleType:
    """Make ``import sglang`` load the tree at ``package_dir`` (a ``sglang/`` folder).

    Puts its parent first on ``sys.path`` (first match wins, so an installed
    sglang or an earlier tree further down is shadowed), purges already-imported sglang
    modules, installs the import stand-ins (with this tree's own
    ``maybe_stub_sgl_kernel``) and imports ``sglang``; checks that it came from
    ``package_dir``. Calling it again with the same tree keeps the modules
    already imported. Switching trees in one process re-imports everything
    (measured: works for the modules of tests/behaviour, about 3 s a switch),
    but see the module docstring for why one tree per process is the reliable
    way.
    """
    package_dir = Path(package_dir).resolve()
    if not (package_dir / "__init__.py").is_file():
        raise FileNotFoundError(f"not an sglang package folder: {package_dir}")
    parent = str(package_dir.parent)
    sys.path[:] = [parent, *(entry for entry in sys.path if entry != parent)]
    loaded = sys.modules.get("sglang")
    loaded_file = getattr(loaded, "__file__", None)
    if loaded_file and Path(loaded_file).resolve().parent == package_dir:
        return loaded  # same tree already imported: keep its modules
    purge_sglang_modules()
    if stubs:
        install_import_stubs(package_dir, upstream_sgl_kernel=upstream_sgl_kernel)
    import sglang

    got = Path(sglang.__file__).resolve().parent
    if got != package_dir:
        raise ImportError(f"imported sglang from {got}, expected {package_dir}")
    return sglang


# --- patched trees run without patchkit ------------------------------------------------------

#: What a patched tree must never need at run time (its runtime is vendored).
PATCHKIT_RUNTIME = ("patchkit.runtime", "patchkit.backends")


class _Unimportable(importlib.abc.MetaPathFinder):
    """Makes the named packages (and their submodules) fail to import, as in
    a serving environment where patchkit is not installed."""

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (blocked: patched trees must not need it)", name=fullname
            )
        return None


@contextlib.contextmanager
def unimportable(names: Iterable[str] = PATCHKIT_RUNTIME):
    """Within the block, importing ``names`` fails; modules already imported
    are set aside (and put back afterwards), so nothing can reach them through
    ``sys.modules`` either."""
    blocker = _Unimportable(names)
    hidden = {n: m for n, m in sys.modules.items() if any(n == b or n.startswith(b + ".") for b in blocker.names)}
    for name in hidden:
        del sys.modules[name]
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(hidden)
