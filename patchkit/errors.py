"""Errors patchkit reports as one line, with the exit code they map to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHANGES = 1  # verification failed, changes needed, or something not applied
EXIT_BAD_INPUT = 2


class PatchkitError(Exception):
    """A user-facing failure: printed as one line, never a traceback."""

    exit_code = EXIT_BAD_INPUT
