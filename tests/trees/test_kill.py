"""A ``kill -9`` of apply, revert or matrix leaves no patchkit process alive,
and the next command takes the tree's lock within 2 s (issue 54, failure 3:
the forked workers shared the lock's flock and lived on under PID 1, so every
later command said "another patchkit run holds this tree"). A matrix's temp
folder that a kill left is removed by the next matrix.

patchkit runs as a session leader: its workers inherit the session, even
once orphaned, so the session's live processes are what the kill left. The
sweep applies two patches of two files (a worker pool of two, the transform
cache off: every run cold), killed at delays spread over one such run.

And 50 real SIGKILLs spread over apply's commit, each followed by
`revert --recover` and by `apply` (issue 68, item 5).
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


SIGKILLS_IN_COMMIT = 50
# One patch that changes a file, one that also vendors its runtime: a commit of nine writes and the state.
IN_COMMIT = ("trtllm-mha-overlap-hook", "verify-wait-on-stream")


def _apply_in_a_child(tree: Path, *patches: str) -> int:
    """``patchkit apply TREE`` in a forked child of this process (its
    modules imported and its caches warm already: the kill lands in the
    commit, not in an interpreter's start); its pid."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which the test kills
        code = 1
        try:
            from click.testing import CliRunner

            from patchkit.cli import main

            code = CliRunner().invoke(main, ["-q", "apply", str(tree), *patches]).exit_code
        finally:
            os._exit(code)
    return child


def _journal_window(journal: Path, child: int) -> tuple[float, float]:
    """When the child's journal appeared and went again (its commit), by
    polling; (appeared, gone) in ``time.monotonic``, waiting for the child."""
    appeared = gone = None
    deadline = time.monotonic() + 120
    while gone is None:
        _before(deadline, child)
        exists = journal.exists()
        now = time.monotonic()
        if exists and appeared is None:
            appeared = now
        elif not exists and appeared is not None:
            gone = now
        elif os.waitpid(child, os.WNOHANG) != (0, 0):
            raise AssertionError("the apply ended without a journal seen")
        time.sleep(0.0002)
    assert os.waitpid(child, 0)[1] == 0
    return appeared, gone


def _before(deadline: float, child: int) -> None:
    """A child that never gets there (one forked while another thread held a lock it needs) fails the test."""
    if time.monotonic() > deadline:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        raise AssertionError("the forked apply did not reach its commit in 120 s")


def _commit_length(source: Path, tmp_path: Path) -> float:
    """How long apply's commit takes here, in seconds: the median of three."""
    lengths = []
    for i in range(3):
        tree = linked_copy(source, tmp_path / f"measured{i}" / "sglang")
        appeared, gone = _journal_window(tree / ".patchkit" / "journal.json", _apply_in_a_child(tree, *IN_COMMIT))
        lengths.append(gone - appeared)
    return sorted(lengths)[1]


def _kill_in_commit(child: int, journal: Path, delay: float) -> int:
    """SIGKILL ``child`` ``delay`` seconds after ``journal`` appears; its wait status."""
    deadline = time.monotonic() + 120
    while not journal.exists():
        _before(deadline, child)
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        time.sleep(0.0002)
    time.sleep(delay)
    os.kill(child, signal.SIGKILL)  # a child that ended meanwhile is a zombie still: no other process gets it
    return os.waitpid(child, 0)[1]


def test_real_sigkills_during_the_commit_then_recover_then_apply(tmp_path, linked_tree, cli):
    """Issue 68, item 5: a real SIGKILL during apply's commit (after
    journal.json appears), then an emptied journal, left `*.patchkit-tmp`
    files behind `revert --recover`, once `srt/_patchkit/` too, after which
    every apply refused. Here 50 kills spread over the commit of two patches
    (two files changed, seven created: the runtime folder and the manifest),
    each followed by `--recover` (the pristine tree, no temp file), by
    `apply` and by `revert`. On disk: each file's fsync is what makes a kill
    land inside a write (in memory one in twenty did). The tree holds only
    the files patchkit reads (its patches' targets): a copy in milliseconds."""
    from support import snapshot

    source = _small_tree(linked_tree(PRIMARY), tmp_path / "small" / "sglang")
    pristine = snapshot(source)
    assert cli("apply", linked_copy(source, tmp_path / "warm" / "sglang"), *IN_COMMIT).exit_code == 0  # caches warm
    commit = _commit_length(source, tmp_path)
    left = {"journal": 0, "temp files": 0}
    for i in range(SIGKILLS_IN_COMMIT):
        tree = linked_copy(source, tmp_path / f"k{i}" / "sglang")
        journal = tree / ".patchkit" / "journal.json"
        delay = commit * i / (SIGKILLS_IN_COMMIT - 1)
        status = _kill_in_commit(_apply_in_a_child(tree, *IN_COMMIT), journal, delay)
        where = f"killed {delay * 1000:.1f} ms into a commit of {commit * 1000:.1f} ms (status {status})"
        assert status in (0, signal.SIGKILL), where  # killed, or done before the kill
        left["temp files"] += bool(_temp_files(tree))
        if journal.exists():
            left["journal"] += 1
            journal.write_bytes(b"")  # as the runs did
        recovered = cli("revert", "--recover", tree)
        assert recovered.exit_code == 0, (where, recovered.output)
        assert _temp_files(tree) == [], where
        assert snapshot(tree) == pristine, where
        applied = cli("apply", tree, *IN_COMMIT)
        assert applied.exit_code == 0, (where, applied.output)
        assert cli("revert", tree).exit_code == 0 and snapshot(tree) == pristine, where
        shutil.rmtree(tree.parent)
    # The kills landed in the commit, inside writes too: what the sweep is for.
    assert left["journal"] >= SIGKILLS_IN_COMMIT // 3 and left["temp files"] > 0, left


def _small_tree(release: Path, dest: Path) -> Path:
    """A tree of ``release``'s package files that patchkit reads (every
    patch's targets, the marker, the version), hard-linked."""
    from patchkit import registry
    from patchkit.tree import _MARKER

    for rel in {t.file for p in registry.all_patches() for t in p.targets} | {
        "__init__.py",
        "version.py",
        str(_MARKER),
    }:
        if (release / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(release / rel, dest / rel)
    return dest


def _temp_files(tree: Path) -> list[Path]:
    return [p for p in tree.rglob("*") if p.name.endswith(".patchkit-tmp")]
