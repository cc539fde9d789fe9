"""Which version strings name a release patchkit may fetch.

A version to fetch names files in the cache (``trees/VERSION``, its lock) and
goes to ``pip download sglang==VERSION``: it must be a version, never a path
nor a pip option (issue 68).
"""

from __future__ import annotations

from patchkit.errors import PatchkitError


def check_fetchable(version: str) -> None:
    """A version to fetch names files in the cache (``trees/VERSION``, its
    lock) and goes to ``pip download sglang==VERSION``: only a PEP 440
    version string (``packaging``'s), never a path nor a pip option."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        pass
    else:
        if version == version.strip():
            return
    raise PatchkitError(f"{version!r}: not a version of sglang (PEP 440, e.g. 0.5.12.post1); nothing was fetched")
