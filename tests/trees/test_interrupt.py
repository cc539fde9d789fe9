"""One Ctrl-C (SIGINT) or SIGTERM ends a cold ``patchkit apply`` (forked
worker pool, empty transform cache) at any moment from patchkit's first line
on: within 2 s, exit 130 / 143, one line on stderr that says which (nothing
changed, or all patches applied) and no traceback, the tree as before or
fully patched (never half), no journal left, and no process of
the run left alive. (A signal while the interpreter itself starts, before any
line of patchkit runs, gets Python's own handling: the delays count from the
moment patchkit's handlers are in, read from /proc.)

SIGINT goes to the whole process group, as a terminal's Ctrl-C does (the
workers get it too); SIGTERM to patchkit's process alone, as ``kill`` does.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import PRIMARY, alive, linked_copy, pristine_snapshot, session_processes, snapshot

pytestmark = [
    pytest.mark.trees,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]

POINTS = 20
EXIT_WITHIN = 2.0  # seconds from the signal to the process's exit
BUDGET = 120.0  # seconds of waiting for all points: fewer points (6 at least) where a cold apply is very slow


def _start(tree: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PATCHKIT_TRANSFORM_CACHE": str(cache), "PATCHKIT_JOBS": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "patchkit", "-q", "apply", str(tree)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_handlers(proc: subprocess.Popen) -> None:
    """Return once ``proc`` catches SIGTERM (patchkit's handlers are in: the
    first thing ``patchkit.__main__`` does) or has ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            return
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)) or proc.poll() is not None:
            return
        time.sleep(0.002)
    pytest.fail("patchkit did not install its signal handlers within 60 s")


def test_one_signal_ends_a_cold_apply_at_any_moment(tmp_path):
    from patchkit.fetch import copy_tree

    source = copy_tree(PRIMARY, tmp_path / "source")
    pristine = pristine_snapshot(PRIMARY)

    # One full cold apply: its time spreads the signals, its tree is "fully patched".
    reference = tmp_path / "reference" / "sglang"
    linked_copy(source, reference)
    started = time.monotonic()
    proc = _start(reference, tmp_path / "cache-reference")
    _, err = proc.communicate(timeout=300)
    cold = time.monotonic() - started
    assert proc.returncode == 0, err
    patched = snapshot(reference)
    assert patched != pristine

    # Delays from 0 s (the handlers just in) to a little past the cold
    # apply's time (its commit, or just after), evenly: they add up to about
    # points * span / 2.
    span = 1.1 * cold
    points = max(6, min(POINTS, int(2 * BUDGET / span)))
    outcomes = []
    for i in range(points):
        delay = span * i / (points - 1)
        sig = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
        tree = tmp_path / f"t{i}" / "sglang"
        linked_copy(source, tree)
        proc = _start(tree, tmp_path / f"cache-{i}")
        _wait_for_handlers(proc)
        time.sleep(delay)
        sent = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C: the whole foreground group
        else:
            proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=EXIT_WITHIN + 10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"point {i} ({sig.name} at {delay:.2f}s): patchkit hung")
        took = time.monotonic() - sent
        where = f"point {i} ({sig.name} at {delay:.2f}s of {cold:.2f}s): rc {proc.returncode}, stderr {err!r}"
        time.sleep(0.05)  # the kernel reaps what the exit ended
        assert session_processes(proc.pid) == [], where
        assert took < EXIT_WITHIN, f"{where}: took {took:.2f}s"
        assert "Traceback" not in err, where
        if proc.returncode == 0:  # it had finished before the signal came
            assert err == "", where
        else:
            assert proc.returncode == 128 + sig, where
        now = snapshot(tree)
        assert now in (pristine, patched), f"{where}: the tree is half-patched"
        if proc.returncode != 0:  # one line that says which of the two it left
            said = r"all \d+ patches were applied before the interrupt" if now == patched else "nothing changed"
            assert re.fullmatch(rf"patchkit: interrupted by {sig.name}: {said}\n", err), where
        assert not (tree / ".patchkit" / "journal.json").exists(), where
        outcomes.append(
            f"{delay:.1f}s {sig.name[3:]} rc={proc.returncode} "
            f"{'patched' if now == patched else 'pristine'} {took:.2f}s"
        )
        shutil.rmtree(tree)
    print(f"cold apply {cold:.2f}s;", "; ".join(outcomes))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_ends_a_parallel_matrix(tmp_path, sig):
    """matrix -j 2 (a process pool of its own): ended within 2 s, its workers
    gone and their copies of the releases removed."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATCHKIT_TRANSFORM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "patchkit", "matrix", "-j", "2", PRIMARY, "0.5.12", "0.5.11", "0.5.10"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # Signalled once its workers copy releases (a fixed wait let a fast machine finish first).
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("patchkit-matrix-") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    sent = time.monotonic()
    os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    time.sleep(0.05)
    assert session_processes(proc.pid) == []
    assert proc.returncode == 128 + sig and err == f"patchkit: interrupted by {sig.name}: nothing changed\n", (
        proc.returncode,
        err,
    )
    assert took < EXIT_WITHIN, took
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("patchkit-matrix-")] == []


def test_an_interrupt_says_what_it_left(tmp_path, monkeypatch, cli):
    """A signal during the write waits for the commit: the results are
    printed and the line says every patch was applied. One before it: the
    line says nothing changed."""
    from patchkit.api import applying
    from patchkit.errors import Interrupted
    from patchkit.fetch import copy_tree

    hook = "trtllm-mha-overlap-hook"
    tree = copy_tree(PRIMARY, tmp_path / "late")
    env = {**os.environ, "PATCHKIT_TEST_SIGNAL_AT": "state::SIGINT"}
    late = subprocess.run(
        [sys.executable, "-m", "patchkit", "apply", str(tree), hook],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert late.returncode == 130, late.stderr
    assert late.stdout.splitlines() == [f"applied: {hook}", "1 file(s) changed, 1 added"], late.stdout
    assert late.stderr.splitlines()[-1] == f"patchkit: interrupted by SIGINT: {hook} was applied before the interrupt"

    def interrupted(*args, **kwargs):
        raise Interrupted(signal.SIGINT)

    early = copy_tree(PRIMARY, tmp_path / "early")
    monkeypatch.setattr(applying, "apply_patches", interrupted)
    result = cli("apply", early, hook)
    assert result.exit_code == 130 and result.output == "patchkit: interrupted by SIGINT: nothing changed\n", (
        result.output
    )
    assert snapshot(early) == pristine_snapshot(PRIMARY)


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_an_interrupt_just_after_the_commit_says_it_was_written(tmp_path, monkeypatch, cli, verb):
    """A signal after the transaction is whole but before apply or revert
    returns (CI 2026-11-28: a Ctrl-C at 3.66 s of a 3.51 s apply left the tree
    fully patched and said "nothing changed"): the line says what was written."""
    from patchkit.api import applying, reverting
    from patchkit.errors import Interrupted
    from patchkit.fetch import copy_tree

    hook = "trtllm-mha-overlap-hook"
    tree = copy_tree(PRIMARY, tmp_path / "t")
    if verb == "revert":
        assert cli("apply", tree, hook).exit_code == 0
    module = applying if verb == "apply" else reverting
    real = module.commit

    def commit_then_interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(module, "commit", commit_then_interrupted)
    result = cli(verb, tree, hook)
    past = "applied" if verb == "apply" else "reverted"
    assert result.exit_code == 130, result.output
    assert result.output.splitlines()[-1] == f"patchkit: interrupted by SIGINT: {hook} was {past} before the interrupt"
    assert (snapshot(tree) == pristine_snapshot(PRIMARY)) == (verb == "revert")


def test_an_interrupt_wrapped_on_its_way_is_still_one_line(tmp_path, monkeypatch, cli):
    """A signal while a class is made (as while libcst is imported) reaches
    the command wrapped in a RuntimeError: the same one line, no traceback."""
    from patchkit.api import applying
    from patchkit.errors import Interrupted
    from patchkit.fetch import copy_tree

    def wrapped(*args, **kwargs):
        try:
            raise Interrupted(signal.SIGINT)
        except Interrupted as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc

    tree = copy_tree(PRIMARY, tmp_path / "t")
    monkeypatch.setattr(applying, "apply_patches", wrapped)
    result = cli("apply", tree)
    assert result.exit_code == 130 and result.output == "patchkit: interrupted by SIGINT: nothing changed\n", (
        result.output
    )
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def _fork_two_workers(said: str) -> None:
    from patchkit.transform.parallel import _forked_pool

    pool = _forked_pool(2, [])
    Path(said).write_text(" ".join(str(pid) for pid in [os.getpid(), *pool._processes]))
    time.sleep(60)


def test_a_matrix_worker_ends_with_the_workers_it_forked(tmp_path):
    """Stopping the matrix's pool (interruptible_pool) ends each worker and the
    transform workers it forked, at once: a worker busy in a native call runs
    no signal handler, and one killed after a second left its own workers
    running (they held the matrix's stderr: the CI run waited 30 s)."""
    from patchkit.transform.parallel import interruptible_pool

    said = tmp_path / "pids"
    with pytest.raises(RuntimeError):
        with interruptible_pool(1) as pool:
            pool.submit(_fork_two_workers, str(said))
            deadline = time.monotonic() + 30
            while not said.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            sent = time.monotonic()
            raise RuntimeError("stop")
    took = time.monotonic() - sent
    pids = [int(pid) for pid in said.read_text().split()]
    deadline = time.monotonic() + 1
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [pid for pid in pids if alive(pid)] == [] and took < 0.9, took


def _send_half_a_result(fd: int) -> None:
    os.write(fd, struct.pack("!i", 1 << 20) + b"x" * 64)  # a 1 MiB message's header, 64 bytes of it
    time.sleep(60)


def test_a_worker_killed_while_it_sends_a_result_does_not_hold_up_the_exit(tmp_path):
    """A worker killed in the middle of sending its result leaves part of a
    message in the pool's result pipe. Stopping the pool still ends its
    manager thread at once (it waited 1.5 s for the rest, then lived on)."""
    from patchkit.transform.parallel import _forked_pool, _stop

    pools: list = []
    pool = _forked_pool(1, pools)
    manager = pool._executor_manager_thread
    pool.submit(_send_half_a_result, pool._result_queue._writer.fileno())
    time.sleep(0.3)
    sent = time.monotonic()
    _stop(pool)
    took = time.monotonic() - sent
    assert not manager.is_alive() and took < 1.0, took  # it waited 1.5 s before; headroom for a loaded CI machine
