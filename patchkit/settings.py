"""The environment variables patchkit reads, each checked where it is read:
a bad value is one line and exit 2, never a traceback or a silent default."""

from __future__ import annotations

import os
from typing import Optional

from patchkit.errors import PatchkitError

# name -> what it does (shown in `patchkit --help` and docs/ci.md)
VARIABLES = {
    "PATCHKIT_LOCK_TIMEOUT": "seconds to wait for another patchkit run on the same tree (default 60)",
    "PATCHKIT_JOBS": "worker processes for a cold apply (default: the CPUs this process may use)",
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
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise PatchkitError(f"PATCHKIT_LOCK_TIMEOUT={value!r}: not a number of seconds (e.g. 60); fix or unset it")
    return seconds


def jobs() -> Optional[int]:
    """PATCHKIT_JOBS, or None when unset."""
    value = _value("PATCHKIT_JOBS")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise PatchkitError(f"PATCHKIT_JOBS={value!r}: not a positive whole number of processes (e.g. 2); fix or unset it")
    return int(value)


def check() -> None:
    """Read every variable once, so a bad value stops any command at its
    start, not only the one code path that happens to read it."""
    lock_timeout()
    jobs()
