"""Shared test helpers: the releases tests use, and file snapshots.

Imported as ``from support import ...`` (not from conftest: tests/behaviour has
a conftest of its own, and two modules named conftest collide)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from patchkit.fetch import fetch_tree

PRE_UPSTREAM = ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"]
PRIMARY = "0.5.12.post1"
NATIVE = "0.5.13"
#: The first release with every patch upstream (FA3's sync-free spec v2 came with 0.5.16).
ALL_NATIVE = "0.5.16"


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
