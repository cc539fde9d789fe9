"""Transactions survive kills; concurrent runs are serialised.

Fault injection: PATCHKIT_TEST_CRASH_AT=<point>[:N] makes patchkit exit like a
SIGKILL at that point (see patchkit.state.crash_point). We also SIGKILL real
subprocesses at random moments. The kill is always a subprocess's; what checks
and settles the tree afterwards runs in this process (``check``: the CLI
through click's runner, a third of a second less per command).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import pytest
from click.testing import CliRunner
from support import PRIMARY, pristine_snapshot, recorded_patched, snapshot

from patchkit import registry
from patchkit.cli import main
from patchkit.state import TEMP_SUFFIX, Store, vendoring

pytestmark = pytest.mark.trees


def run(tree, *args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args, str(tree)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def check(tree, *args) -> Ran:
    """``patchkit ARGS TREE`` in this process: the reads and settles after a
    kill (the kill itself is ``run``'s, a subprocess's)."""
    result = CliRunner().invoke(main, [*args, str(tree)], catch_exceptions=False)
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def patched_reference():
    """The primary release fully patched, to compare against (as
    tests/patched_digests.json records it)."""
    return recorded_patched(PRIMARY)


def target_files():
    """Target files the primary release has (optional ones may be absent)."""
    present = pristine_snapshot(PRIMARY)
    return sorted({f for p in registry.all_patches() for f in p.files if f in present})


def assert_each_file_consistent(tree, reference):
    """Every file is either byte-identical to the original or to the patched one."""
    orig, now = pristine_snapshot(PRIMARY), snapshot(tree)
    for rel in target_files():
        assert now[rel] in (orig[rel], reference[rel]), f"{rel} is half-written"


def assert_settled(tree, reference, verb):
    """Read commands report an interrupted run and leave every byte as they
    found it; ``verb`` then finishes the transaction (the verb that was
    interrupted) or rolls it back (the other one). Returns what it said."""
    before = snapshot(tree)
    pending = (tree / ".patchkit" / "journal.json").exists()
    status, verify = check(tree, "status"), check(tree, "verify")
    assert snapshot(tree) == before, "a read command wrote the tree"
    assert (tree / ".patchkit" / "journal.json").exists() == pending
    if pending:
        assert "is pending: `patchkit " in status.stdout
        assert verify.returncode == 1 and "is pending" in verify.stderr
    settle = check(tree, verb)
    assert settle.returncode == 0, settle.stderr
    assert not (tree / ".patchkit" / "journal.json").exists()
    assert snapshot(tree) == (reference if verb == "apply" else pristine_snapshot(PRIMARY))
    assert check(tree, "verify").returncode == (0 if verb == "apply" else 1)
    assert check(tree, "revert").returncode == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
    return settle.stderr


def crash_points(reference) -> list[str]:
    """Every point a transaction can die at: after the journal, after each
    file it writes, after the state."""
    orig = pristine_snapshot(PRIMARY)
    written = [rel for rel in target_files() if orig[rel] != reference[rel]]
    return ["journal", *(f"file:{i}" for i in range(1, len(written) + 1)), "state"]


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_killed_at_every_point_is_finished_or_rolled_back(linked_tree, patched_reference, verb):
    other = "revert" if verb == "apply" else "apply"
    points = crash_points(patched_reference)
    for i, point in enumerate(points):
        tree = linked_tree(PRIMARY)
        if verb == "revert":
            assert check(tree, "apply").returncode == 0
        crashed = run(tree, verb, env={"PATCHKIT_TEST_CRASH_AT": point})
        assert crashed.returncode == 137, (point, crashed.stderr)
        assert_each_file_consistent(tree, patched_reference)
        # Every other point is settled by the other command: it rolls back.
        settle = verb if i % 2 == 0 else other
        message = assert_settled(tree, patched_reference, settle)
        done = "finished it" if settle == verb else "rolled it back"
        assert f"an interrupted {verb} of " in message and done in message, (point, message)
    print(f"{verb}: killed at {len(points)} points ({', '.join(points)}); each finished or rolled back")


@pytest.mark.parametrize("settle", ["apply", "revert"])
def test_a_kill_inside_a_files_write_leaves_no_temp_file(linked_tree, patched_reference, settle):
    """SIGKILL between a file's temp write and its rename leaves the temp file
    beside it (what CI once caught at a random moment); settling removes it."""
    tree = linked_tree(PRIMARY)
    assert run(tree, "apply", env={"PATCHKIT_TEST_CRASH_AT": "file:1"}).returncode == 137
    second = json.loads((tree / ".patchkit" / "journal.json").read_text())["files"][1]["file"]
    target = tree / second
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    os.write(fd, b"half of a file")
    os.close(fd)
    assert_settled(tree, patched_reference, settle)


def test_a_kill_inside_a_removal_leaves_no_empty_folder(linked_tree, patched_reference):
    """SIGKILL after a revert unlinked a runtime file but before it removed
    the folder: finishing the revert removes the folder too, so a later apply
    does not find a runtime folder that patchkit did not write."""
    tree = linked_tree(PRIMARY)
    assert check(tree, "apply").returncode == 0
    assert run(tree, "revert", env={"PATCHKIT_TEST_CRASH_AT": "file:1"}).returncode == 137
    removals = [
        e["file"]
        for e in json.loads((tree / ".patchkit" / "journal.json").read_text())["files"]
        if e["after"] is None and (tree / e["file"]).exists()
    ]
    for rel in removals:  # the kill came after the last unlink, before any rmdir
        (tree / rel).unlink()
    assert_settled(tree, patched_reference, "revert")
    assert not (tree / vendoring.FOLDER).exists()
    assert check(tree, "apply").returncode == 0


def test_sigkill_at_random_moments(linked_tree, patched_reference):
    rng = random.Random(1234)
    for attempt in range(8):
        tree = linked_tree(PRIMARY)
        verb = "apply" if attempt % 2 == 0 else "revert"
        if verb == "revert":
            assert check(tree, "apply").returncode == 0
        proc = subprocess.Popen(
            [sys.executable, "-m", "patchkit", verb, str(tree)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_each_file_consistent(tree, patched_reference)
        assert_settled(tree, patched_reference, "apply" if attempt % 4 < 2 else "revert")


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_in_the_write_phase_waits_for_the_commit(linked_tree, patched_reference, signame):
    """A signal at any point of the transaction is held until it is
    committed: the process exits 130 / 143 with the tree fully patched."""
    points = crash_points(patched_reference)
    for point in points:
        tree = linked_tree(PRIMARY)
        at = point if ":" in point else f"{point}:"  # label:N:SIGNAL, N empty for a one-pass point
        result = run(tree, "apply", env={"PATCHKIT_TEST_SIGNAL_AT": f"{at}:{signame}"})
        assert result.returncode == 128 + getattr(signal, signame), (point, result.stderr)
        assert f"interrupted by {signame}" in result.stderr
        assert not (tree / ".patchkit" / "journal.json").exists()
        assert snapshot(tree) == patched_reference, point


def test_signals_at_random_moments_leave_all_or_nothing(linked_tree, patched_reference):
    """Real signals at random moments of warm-cache applies (a write window
    of a few hundred milliseconds): the tree is pristine or fully patched."""
    rng = random.Random(4321)
    warm = linked_tree(PRIMARY)
    assert check(warm, "apply").returncode == 0  # fills the shared transform cache
    outcomes = []
    for attempt in range(10):
        tree = linked_tree(PRIMARY)
        sig = signal.SIGINT if attempt % 2 else signal.SIGTERM
        proc = subprocess.Popen(
            [sys.executable, "-m", "patchkit", "apply", str(tree)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.1, 1.2))
        proc.send_signal(sig)
        proc.wait()
        now = snapshot(tree)
        assert now in (pristine_snapshot(PRIMARY), patched_reference), attempt
        assert not (tree / ".patchkit" / "journal.json").exists()
        assert proc.returncode in (0, 128 + sig, -sig), proc.returncode
        outcomes.append("patched" if now == patched_reference else "pristine")
    print("signal outcomes:", outcomes)


def test_two_applies_at_once_are_serialised(linked_tree, patched_reference):
    tree = linked_tree(PRIMARY)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "patchkit", "apply", str(tree)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert snapshot(tree) == patched_reference
    assert check(tree, "verify").returncode == 0


def test_lock_timeout_is_a_clear_error(linked_tree):
    tree = linked_tree(PRIMARY)
    store = Store(tree / ".patchkit")
    with store.locked(timeout=1):
        result = run(tree, "apply", env={"PATCHKIT_LOCK_TIMEOUT": "0.3"})
    assert result.returncode == 2
    assert "another patchkit run holds this tree" in result.stderr
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
