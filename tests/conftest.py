"""Shared fixtures: real sglang trees (downloaded at test time, cached outside
git) and a CLI runner. Plain helpers live in support.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402
from support import PRIMARY  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _transform_cache(tmp_path_factory):
    """The shared transform cache lives in a folder of this test session, never
    the user's ~/.cache (tests/test_transform_cache.py points it elsewhere too)."""
    import os

    folder = tmp_path_factory.mktemp("transform-cache")
    old = os.environ.get("PATCHKIT_TRANSFORM_CACHE")
    os.environ["PATCHKIT_TRANSFORM_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("PATCHKIT_TRANSFORM_CACHE", None)
    else:
        os.environ["PATCHKIT_TRANSFORM_CACHE"] = old


@pytest.fixture
def make_tree(tmp_path):
    """make_tree(version, layout='package') -> path to pass to patchkit, a
    private copy of the real release."""
    counter = iter(range(1000))

    def make(version: str = PRIMARY, layout: str = "package") -> Path:
        return copy_tree(version, tmp_path / f"t{next(counter)}", layout)

    return make


@pytest.fixture
def cli():
    """cli(*args) -> click Result; exceptions other than SystemExit propagate."""
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run
