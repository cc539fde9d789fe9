"""Shared fixtures: real sglang trees (downloaded at test time, cached outside
git) and a CLI runner."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit.cli import main
from patchkit.fetch import copy_tree, fetch_tree

PRE_UPSTREAM = ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"]
PRIMARY = "0.5.12.post1"
NATIVE = "0.5.13"


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


def snapshot(package: Path) -> dict[str, str]:
    """sha256 of every file of a package folder, .patchkit excluded."""
    return {
        str(p.relative_to(package)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(package.rglob("*"))
        if p.is_file() and ".patchkit" not in p.relative_to(package).parts
    }


def pristine(version: str) -> Path:
    return fetch_tree(version)


@lru_cache(maxsize=None)
def _pristine_snapshot(version: str) -> tuple:
    return tuple(snapshot(fetch_tree(version)).items())


def pristine_snapshot(version: str) -> dict[str, str]:
    """snapshot() of the pristine release, computed once per test session."""
    return dict(_pristine_snapshot(version))
