"""The environment variables patchkit reads, each checked where it is read:
a bad value is one line and exit 2, never a traceback or a silent default."""

from __future__ import annotations

import errno
import os
import textwrap
from pathlib import Path
from typing import Optional

from patchkit.errors import PatchkitError

# name -> what it does (shown in `patchkit --help` and docs/ci.md)
VARIABLES = {
    "PATCHKIT_LOCK_TIMEOUT": "seconds to wait for another patchkit run on the same tree (default 60)",
    "PATCHKIT_JOBS": "worker processes for a cold apply (default: the CPUs this process may use)",
    "PATCHKIT_CACHE_DIR": "patchkit's cache folder: downloaded sglang releases (fetch, matrix) and the transform "
    "cache (default $XDG_CACHE_HOME/patchkit, else ~/.cache/patchkit)",
    "PATCHKIT_TRANSFORM_CACHE": "off to disable the transform cache, or a folder for it alone "
    "(default $PATCHKIT_CACHE_DIR/transforms)",
}

# old name -> the name that replaced it. The old one still works, with one
# note on stderr, so scripts written for earlier 0.2.0 builds keep running.
DEPRECATED = {
    "PATCHKIT_CACHE": "PATCHKIT_CACHE_DIR",
}


def _value(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return None if value is None or not value.strip() else value.strip()


def lock_timeout(default: float = 60.0) -> float:
    value = _value("PATCHKIT_LOCK_TIMEOUT")
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise PatchkitError(
            f"PATCHKIT_LOCK_TIMEOUT={value!r}: not a number of seconds; allowed: 0 (do not wait) "
            "or more, finite (e.g. 60); fix or unset it"
        ) from None
    if not 0 <= seconds < float("inf"):
        raise PatchkitError(
            f"PATCHKIT_LOCK_TIMEOUT={value!r}: out of range; allowed: 0 (do not wait) or more "
            "seconds, finite (e.g. 60); fix or unset it"
        )
    return seconds


def jobs() -> Optional[int]:
    """PATCHKIT_JOBS, or None when unset."""
    value = _value("PATCHKIT_JOBS")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise PatchkitError(
            f"PATCHKIT_JOBS={value!r}: not a positive whole number of processes; allowed: 1 or "
            "more (e.g. 2); fix or unset it"
        )
    return int(value)


def _folder(name: str, value: str) -> Path:
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # ~user of no such user, or ~ with no HOME
        raise PatchkitError(f"{name}={value!r}: names the home folder of no user here; fix or unset it") from None
    if path.exists() and not path.is_dir():
        raise PatchkitError(f"{name}={value!r}: not a folder; fix or unset it")
    return path


def _off(value: str) -> bool:
    return value.lower() in ("off", "0", "none", "false", "no")


def cache_dir() -> Path:
    """The one folder patchkit caches into: ``wheels/`` and ``trees/`` (fetched
    releases) and ``transforms/``. ``PATCHKIT_CACHE`` is its old name.
    ``PATCHKIT_CACHE_DIR=off`` is earlier 0.2.0 builds' spelling of "no transform cache"
    (that variable named the transform cache alone then): downloads still need
    a folder, so they go to the default one."""
    for name in ("PATCHKIT_CACHE_DIR", "PATCHKIT_CACHE"):
        value = _value(name)
        if value is not None and not _off(value):
            return _folder(name, value)
    base = _value("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "patchkit"


def _explicit_cache() -> bool:
    """The cache folder is one a variable names (not the default under HOME)."""
    values = [_value(name) for name in ("PATCHKIT_CACHE_DIR", "PATCHKIT_CACHE")]
    return any(v is not None and not _off(v) for v in values) or _value("XDG_CACHE_HOME") is not None


def make_cache_folder(folder: Path) -> None:
    """Create ``folder``, one of patchkit's cache, and what is missing above
    it. Only below a folder that exists: the one above the cache folder a
    variable names, else HOME. patchkit never creates a missing HOME (a
    service user's ``HOME=/nonexistent``) nor the path a variable leads
    through: that is an ``OSError`` naming it, as any cache folder that
    cannot be made."""
    anchors = [(cache_dir(), cache_dir().parent if _explicit_cache() else Path.home())]
    transforms = _value("PATCHKIT_TRANSFORM_CACHE")
    if transforms is not None and not _off(transforms):
        named = _folder("PATCHKIT_TRANSFORM_CACHE", transforms)
        anchors.insert(0, (named, named.parent))
    for root, anchor in anchors:
        if folder.is_relative_to(root) and not anchor.is_dir():
            code = errno.ENOTDIR if anchor.exists() else errno.ENOENT
            raise OSError(code, os.strerror(code), str(anchor))
    folder.mkdir(parents=True, exist_ok=True)


def transform_cache_dir() -> Optional[Path]:
    """Where the transform cache lives; None when it is off."""
    value = _value("PATCHKIT_TRANSFORM_CACHE")
    if value is not None:
        return None if _off(value) else _folder("PATCHKIT_TRANSFORM_CACHE", value)
    return None if _legacy_off() else cache_dir() / "transforms"


def _legacy_off() -> bool:
    """``PATCHKIT_CACHE_DIR=off`` (or empty): earlier 0.2.0 builds' way to disable the transform cache."""
    legacy = os.environ.get("PATCHKIT_CACHE_DIR")
    return legacy is not None and (not legacy.strip() or _off(legacy.strip()))


def deprecations() -> list[str]:
    """One note per deprecated variable (or value) that is set."""
    notes = []
    for old, new in DEPRECATED.items():
        if _value(old) is not None:
            also = f" ({new} is set too and wins)" if _value(new) is not None else ""
            notes.append(f"{old} is deprecated: use {new}{also}")
    if _legacy_off():
        notes.append(
            f"PATCHKIT_CACHE_DIR={os.environ['PATCHKIT_CACHE_DIR']!r} to disable the transform cache is "
            "deprecated: use PATCHKIT_TRANSFORM_CACHE=off"
        )
    return notes


def epilog() -> str:
    """The variables, for ``patchkit --help`` (click keeps \b blocks as written)."""
    lines = ["\b", "Environment variables:"]
    for name, what in VARIABLES.items():
        lines.append(f"  {name}")
        lines += textwrap.wrap(what, 76, initial_indent="      ", subsequent_indent="      ")
    lines += [f"  {old}  deprecated name of {new}" for old, new in DEPRECATED.items()]
    return "\n".join(lines)


def check() -> None:
    """Read every variable once, so a bad value stops any command at its
    start, not only the one code path that happens to read it."""
    lock_timeout()
    jobs()
    cache_dir()
    transform_cache_dir()
