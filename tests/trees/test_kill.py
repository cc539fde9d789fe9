"""A ``kill -9`` of apply, revert or matrix leaves no patchkit process alive,
and the next command takes the tree's lock within 2 s (issue 54, failure 3:
the forked workers shared the lock's flock and lived on under PID 1, so every
later command said "another patchkit run holds this tree"). A matrix's temp
folder that a kill left is removed by the next matrix.

patchkit runs as a session leader: its workers inherit the session, even
once orphaned, so the session's live processes are what the kill left. The
sweep applies two patches of two files (a worker pool of two, the transform
cache off: every run cold), killed at delays spread over one such run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import PRIMARY, linked_copy, session_processes

from patchkit.state import Store

pytestmark = [pytest.mark.trees, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")]

KILLS = 30
WITHIN = 2.0  # seconds from the kill until no process is left and the lock is free
# Two patches, one file each: a pool of two workers, a short run.
PATCHES = ("trtllm-mha-overlap-hook", "trtllm-mla-overlap-hook")


def _start(*args, env: dict | None = None, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """patchkit in a session of its own (stderr: not a pipe where it is
    killed, as the orphans a kill left held the pipe open)."""
    env = {**os.environ, "PATCHKIT_TRANSFORM_CACHE": "off", "PATCHKIT_JOBS": "2", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "patchkit", "-q", *map(str, args)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def _kill(proc: subprocess.Popen, tree: Path | None, where: str) -> None:
    """SIGKILL to patchkit alone (as ``kill -9 PID``); then within 2 s no
    process of its session is left and the tree's lock can be taken."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    left = session_processes(proc.pid)
    while left and time.monotonic() < killed + WITHIN:
        time.sleep(0.02)
        left = session_processes(proc.pid)
    try:
        assert left == [], f"{where}: processes left after kill -9: {left}"
        if tree is not None:
            with Store(tree / ".patchkit").locked(max(0.0, killed + WITHIN - time.monotonic())):
                pass
    finally:
        for line in left:  # a failed run's orphans must not outlive the test
            with contextlib.suppress(OSError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_kill_9_of_apply_and_revert_leaves_no_process_and_the_lock_free(tmp_path, linked_tree, cli):
    source = linked_tree(PRIMARY)
    reference = linked_copy(source, tmp_path / "reference" / "sglang")
    started = time.monotonic()
    proc = _start("apply", reference, *PATCHES, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=300)
    cold = time.monotonic() - started
    assert proc.returncode == 0, err
    # From the start of the interpreter to a little past the run's end.
    for i in range(KILLS):
        tree = linked_copy(source, tmp_path / f"t{i}" / "sglang")
        proc = _start("apply", tree, *PATCHES)
        time.sleep(1.1 * cold * i / (KILLS - 1))
        _kill(proc, tree, f"apply killed at {1.1 * cold * i / (KILLS - 1):.2f}s of {cold:.2f}s")
    # The last tree, whatever the kill left of it, is settled and patched by the next apply.
    assert cli("apply", tree, *PATCHES).exit_code == 0

    for i in range(4):  # revert forks no workers: the lock is all there is to check
        tree = linked_copy(reference, tmp_path / f"r{i}" / "sglang")
        proc = _start("revert", tree)
        time.sleep(0.3 * cold * i)
        _kill(proc, tree, f"revert killed at {0.3 * cold * i:.2f}s")


def test_kill_9_of_a_parallel_matrix(tmp_path, monkeypatch):
    """matrix -j 2, killed while its workers copy and apply: they die with it;
    the folder it left is removed by the next matrix (only a folder whose
    owner is gone: the next matrix's own is not)."""
    from patchkit.api import matrix

    proc = _start("matrix", "-j", "2", PRIMARY, "0.5.12", env={"TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("patchkit-matrix-*/*")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.returncode
        time.sleep(0.05)
    time.sleep(0.5)
    _kill(proc, None, "matrix")
    left = list(tmp_path.glob("patchkit-matrix-*"))
    assert len(left) == 1

    seen = []

    def fake(version: str, workdir: str | None = None) -> dict:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        return {
            "release": version,
            "error": None,
            "patches": {},
            "changed_files": [],
            "verify_ok": True,
            "idempotent": True,
            "revert_exact": True,
            "seconds": 0.0,
            "ok": True,
        }

    monkeypatch.setattr(matrix, "run_release", fake)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert matrix.run_matrix(["a"])["ok"]
    assert len(seen[0]) == 1 and seen[0][0] != left[0].name  # its own folder only
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_does_not_hold_the_trees_lock(tmp_path):
    """flock locks belong to the open file description, which a fork shares:
    a child forked while the lock was held kept it after the parent let go."""
    store = Store(tmp_path / ".patchkit")
    ready, said = os.pipe()
    with store.locked(0):
        child = os.fork()
        if child == 0:  # pragma: no cover - the child says it runs, then waits to be killed
            os.write(said, b"x")
            time.sleep(30)
            os._exit(0)
        os.read(ready, 1)  # the child's fork handlers have run
    try:
        with Store(tmp_path / ".patchkit").locked(0):
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(said)
