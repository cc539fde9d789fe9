"""Errors patchkit reports as one line, with the exit code they map to."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_CHANGES = 1  # verification failed, changes needed, or something not applied
EXIT_BAD_INPUT = 2


class PatchkitError(Exception):
    """A user-facing failure: printed as one line, never a traceback."""

    exit_code = EXIT_BAD_INPUT


def untrusted_json(data: str | bytes) -> Any:
    """``json.loads`` of what patchkit reads back from a file (a manifest, a
    state, a journal, a cache entry): anyone may have written it. JSON nested
    deeper than the parser recurses (``'[' * 200000``) is bad JSON like any
    other, a ``ValueError``, never a ``RecursionError`` out of every command."""
    import json  # here: this module imports nothing (``Interrupted``)

    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


class Interrupted(BaseException):
    """SIGINT or SIGTERM: raised by patchkit's handlers, or once the
    transaction it waited for is done (``patchkit.state.held_signals``). It
    lives here, in a module that imports nothing, so that ``patchkit.__main__``
    installs its handlers before any other import. ``waited``: raised once
    the transaction it waited for was written (the change is complete)."""

    def __init__(self, signum: int, waited: bool = False) -> None:
        super().__init__(signum)
        self.signum, self.waited = signum, waited


def interrupt_in(exc: BaseException | None) -> "Interrupted | None":
    """The ``Interrupted`` that ``exc`` is, or that caused it: Python wraps
    one raised where it cannot pass as itself (a ``__set_name__`` while a
    class is made, as when a signal comes while libcst is imported)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, Interrupted):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class failure_in:
    """``with failure_in(WHAT):`` code that is not patchkit's to vouch for
    (a patch set's codemod or postcondition) may fail any way: one line
    naming ``WHAT``, nothing changed. A signal Python wrapped (an import's)
    ends the command as itself."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, PatchkitError):
            return
        if interrupt_in(exc) is not None:
            return
        raise PatchkitError(f"{self.what} failed to run: {type(exc).__name__}: {exc}; nothing was changed") from None
