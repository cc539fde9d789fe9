"""patchkit's SIGINT / SIGTERM handlers (patchkit/__main__.py): a signal whose handler runs
inside a finalizer, where Python would print the exception and drop it, ends the command once
the finalizer is over (2026-11-28: CI's interrupt test caught a Ctrl-C at 3.36 s of a 3.62 s
apply inside a WeakValueDictionary's callback: a traceback on stderr, the apply went on, rc 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from patchkit.__main__ import _in_finalizer

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import signal
import time
from patchkit.__main__ import _install_handlers
from patchkit.errors import Interrupted

_install_handlers()


class Held:
    def __del__(self):
        signal.raise_signal(signal.SIG)
        for _ in range(3):  # the handler runs here, inside the finalizer
            pass


try:
    held = Held()
    del held
    time.sleep(5)  # the command goes on; the signal ends it here, once the finalizer is over
    print("not interrupted")
except Interrupted as exc:
    print("interrupted", exc.signum)
"""


def _run(sig: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = SCRIPT.replace("signal.SIG)", f"signal.{sig})")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_signal_inside_a_finalizer_ends_the_command_after_it():
    for sig, num in (("SIGINT", 2), ("SIGTERM", 15)):
        done = _run(sig)
        assert (done.stdout, done.stderr) == (f"interrupted {num}\n", ""), sig


def _frame(name: str, filename: str, back=None) -> SimpleNamespace:
    return SimpleNamespace(f_code=SimpleNamespace(co_name=name, co_filename=filename), f_back=back)


def test_finalizers_are_told_by_their_frames():
    main = _frame("apply", "/x/patchkit/api/__init__.py")
    assert not _in_finalizer(main) and not _in_finalizer(None)
    # WeakValueDictionary's callback (the CI case), and code a __del__ calls
    assert _in_finalizer(_frame("remove", "/usr/lib/python3.11/weakref.py", main))
    assert _in_finalizer(_frame("rmtree", "/usr/lib/python3.11/shutil.py", _frame("__del__", "/t.py", main)))
