"""The ``patchkit`` command (and ``python -m patchkit``).

SIGINT and SIGTERM end any command the same way, from the first line of
patchkit that runs: one line on stderr, exit 130 (SIGINT) or 143 (SIGTERM),
no traceback. A signal that arrives while a transaction writes the tree waits
for its end (``patchkit.state.held_signals``): the tree is as before or fully
changed. Once the command has ended, signals are ignored while the process
exits (no traceback from exit handlers)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` or a weakref's callback
    (weakref.py's containers and ``finalize``): Python prints an exception
    raised there as "Exception ignored" and drops it."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return True
        frame = frame.f_back
    return False


def _install_handlers() -> None:
    from patchkit.errors import Interrupted

    def interrupt(signum: int, frame) -> None:
        if _in_finalizer(frame):
            # Raised here it would be printed with a traceback and lost, and the command
            # would go on (2026-11-28: a Ctrl-C at 3.36 s of a 3.62 s apply, inside a
            # WeakValueDictionary's callback). Send it again in a moment, from another
            # thread: by then the finalizer is over (raised from this handler, it would come
            # back at once, inside the handler, for good).
            again = threading.Timer(0.001, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
            return
        raise Interrupted(signum)

    for sig in _SIGNALS:
        signal.signal(sig, interrupt)


def _exit_code() -> int:
    try:
        try:
            # The handlers go in before any other import: with patchkit.state
            # imported first, a Ctrl-C in that import at times ended the
            # process by SIGINT (-2) after its own one-line message.
            _install_handlers()
            from patchkit.cli import main

            main.main(prog_name="patchkit")  # click's standalone mode: ends by SystemExit
            return 0
        finally:
            for sig in _SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except KeyboardInterrupt:  # a Ctrl-C before the handlers were installed
        return _interrupted(signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001
        from patchkit.errors import interrupt_in

        caught = interrupt_in(exc)
        if caught is None:
            raise
        return _interrupted(caught.signum)


def _interrupted(signum: int) -> int:
    # Outside a command (before it starts): nothing was written.
    sys.stderr.write(f"patchkit: interrupted by {signal.Signals(signum).name}: nothing changed\n")
    return 128 + signum


def run() -> None:
    # A command is one short process: the cyclic GC would only re-scan what
    # the imports and the command made (the transform's workers run without
    # it too), and at exit, frozen, that is not scanned once more.
    gc.disable()
    code = _exit_code()
    gc.freeze()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        # Interrupted: the tree is settled and the line said. Leave now, without the
        # exit handlers: concurrent.futures' joins a stopped pool's manager thread with
        # no time limit, and one still ending at that moment once held the exit for good.
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
