"""The write phase of a transaction holds SIGINT and SIGTERM: the tree is
all-or-nothing when the process exits (``Store.commit``, ``Store.recover``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from patchkit.errors import Interrupted


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block (the write phase of a
    transaction): the tree is all-or-nothing when the process exits. A signal
    that arrived is raised as ``Interrupted`` when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise Interrupted(received[0], waited=True)
