"""Transactions survive kills; concurrent runs are serialised.

Fault injection: PATCHKIT_TEST_CRASH_AT=<point>[:N] makes patchkit exit like a
SIGKILL at that point (see patchkit.state.crash_point). We also SIGKILL real
subprocesses at random moments.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from support import PRIMARY, pristine_snapshot, snapshot
from patchkit import registry
from patchkit.state import Store

pytestmark = pytest.mark.trees


def run(tree, *args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args, str(tree)],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, **kw,
    )


@pytest.fixture(scope="module")
def patched_reference(tmp_path_factory):
    """A fully patched copy of the primary release, to compare against."""
    from patchkit.fetch import copy_tree

    tree = copy_tree(PRIMARY, tmp_path_factory.mktemp("ref"))
    assert run(tree, "apply").returncode == 0
    return snapshot(tree)


def target_files():
    """Target files the primary release has (optional ones may be absent)."""
    present = pristine_snapshot(PRIMARY)
    return sorted({f for p in registry.all_patches() for f in p.files if f in present})


def assert_each_file_consistent(tree, reference):
    """Every file is either byte-identical to the original or to the patched one."""
    orig, now = pristine_snapshot(PRIMARY), snapshot(tree)
    for rel in target_files():
        assert now[rel] in (orig[rel], reference[rel]), f"{rel} is half-written"


def assert_recovered_and_coherent(tree, reference):
    status = run(tree, "status")
    assert status.returncode == 0, status.stderr
    assert not (tree / ".patchkit" / "journal.json").exists()
    now = snapshot(tree)
    assert now in (pristine_snapshot(PRIMARY), reference), "tree neither original nor fully patched"
    if now == reference:
        assert run(tree, "verify").returncode == 0
    assert run(tree, "revert").returncode == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
    return status.stderr


def crash_points(reference) -> list[str]:
    """Every point a transaction can die at: after the journal, after each
    file it writes, after the state."""
    orig = pristine_snapshot(PRIMARY)
    written = [rel for rel in target_files() if orig[rel] != reference[rel]]
    return ["journal", *(f"file:{i}" for i in range(1, len(written) + 1)), "state"]


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_killed_at_every_point_recovers(make_tree, patched_reference, verb):
    points = crash_points(patched_reference)
    for point in points:
        tree = make_tree(PRIMARY)
        if verb == "revert":
            assert run(tree, "apply").returncode == 0
        crashed = run(tree, verb, env={"PATCHKIT_TEST_CRASH_AT": point})
        assert crashed.returncode == 137, (point, crashed.stderr)
        assert_each_file_consistent(tree, patched_reference)
        message = assert_recovered_and_coherent(tree, patched_reference)
        assert "recovered an interrupted patchkit run" in message, point
    print(f"{verb}: killed at {len(points)} points ({', '.join(points)}); all recovered")


def test_sigkill_at_random_moments(make_tree, patched_reference):
    rng = random.Random(1234)
    for attempt in range(8):
        tree = make_tree(PRIMARY)
        verb = "apply" if attempt % 2 == 0 else "revert"
        if verb == "revert":
            assert run(tree, "apply").returncode == 0
        proc = subprocess.Popen([sys.executable, "-m", "patchkit", verb, str(tree)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_each_file_consistent(tree, patched_reference)
        assert_recovered_and_coherent(tree, patched_reference)


def test_two_applies_at_once_are_serialised(make_tree, patched_reference):
    tree = make_tree(PRIMARY)
    procs = [subprocess.Popen([sys.executable, "-m", "patchkit", "apply", str(tree)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert snapshot(tree) == patched_reference
    assert run(tree, "verify").returncode == 0


def test_lock_timeout_is_a_clear_error(make_tree):
    tree = make_tree(PRIMARY)
    store = Store(tree / ".patchkit")
    with store.locked(timeout=1):
        result = run(tree, "apply", env={"PATCHKIT_LOCK_TIMEOUT": "0.3"})
    assert result.returncode == 2
    assert "another patchkit run holds this tree" in result.stderr
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
