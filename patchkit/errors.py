"""Errors patchkit reports as one line, with the exit code they map to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHANGES = 1  # verification failed, changes needed, or something not applied
EXIT_BAD_INPUT = 2


class PatchkitError(Exception):
    """A user-facing failure: printed as one line, never a traceback."""

    exit_code = EXIT_BAD_INPUT


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
