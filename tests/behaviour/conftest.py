"""Behaviour tests: real (pristine or patched) sglang modules imported on CPU.

They need the packages of ``requirements-behaviour.txt`` (CPU torch, triton,
transformers, ...); without them every test here skips. ``tests/sglang_cpu_env.py``
stands in for the GPU-only ``torchvision`` and ``sgl_kernel`` (see its docstring).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import profiling  # noqa: E402
from sglang_cpu_env import (  # noqa: E402
    import_sglang_tree,
    install_import_stubs,
    install_torchvision_stand_in,
    unimportable,
)

#: Packages without which no sglang module imports; tests skip when one is missing.
HEAVY = ("torch", "triton", "transformers")

#: The tree whose ``maybe_stub_sgl_kernel`` provides the sgl_kernel stub (the
#: function is identical in every cached release, 0.5.10 .. 0.5.23).
STUB_SOURCE_VERSION = "0.5.12.post1"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "behaviour: imports real sglang modules on CPU (needs requirements-behaviour.txt)",
    )


def missing_heavy() -> list[str]:
    return [name for name in HEAVY if importlib.util.find_spec(name) is None]


# Now, before any test module of this folder imports transformers (which caches
# whether torchvision is available); sgl_kernel waits for cpu_env (needs a tree).
if not missing_heavy():
    install_torchvision_stand_in()


@pytest.fixture(scope="session")
def cpu_env() -> dict[str, str]:
    """Install the import stand-ins once per session; skip without the heavy env.

    Returns which packages were replaced and by what.
    """
    missing = missing_heavy()
    if missing:
        pytest.skip(
            f"behaviour env not installed ({', '.join(missing)} missing): pip install -r requirements-behaviour.txt"
        )
    from patchkit.fetch import fetch_tree

    return install_import_stubs(fetch_tree(STUB_SOURCE_VERSION))


@pytest.fixture(scope="session")
def load_sglang(cpu_env):
    """load_sglang(package_dir) -> the ``sglang`` package imported from that tree.

    Re-loading the same tree is free; another tree purges the previous one's
    modules (see ``import_sglang_tree``). ``sys.path`` is restored at session end.
    """
    saved = list(sys.path)

    def load(package_dir, **kwargs):
        # Patched trees carry their runtime (vendored): they import without it.
        with unimportable(), profiling.timed("import sglang"):
            return import_sglang_tree(package_dir, **kwargs)

    yield load
    sys.path[:] = saved


@pytest.fixture(scope="session")
def load_patched(tmp_path_factory, load_sglang):
    """load_patched(version, patch, module) -> ``module`` of a fresh copy of the release
    ``version`` with ``patch`` applied (and what it requires), imported from that tree."""

    def load(version: str, patch: str, module: str):
        from click.testing import CliRunner

        from patchkit.cli import main
        from patchkit.fetch import copy_tree

        package = copy_tree(version, tmp_path_factory.mktemp(patch), "package")
        result = CliRunner().invoke(main, ["apply", str(package), patch], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        load_sglang(package)
        loaded = importlib.import_module(module)
        assert loaded.__file__.startswith(str(package))
        return loaded

    return load


@pytest.fixture(scope="module", autouse=True)
def patchkit_runtime_unimportable():
    """Every behaviour test module (its fixtures that import the patched tree
    included: autouse comes first in its scope) runs as in a serving
    environment without patchkit: ``patchkit.runtime`` / ``patchkit.backends``
    cannot be imported (patchkit's CLI itself, used to apply, never imports them)."""
    with unimportable():
        yield
