"""A write that fails (disk full, permission) rolls back at once: one line,
exit 2, every file as it was, no journal, no temp file
(docs/reliability.md, "Writes that fail").

Fault injection: PATCHKIT_TEST_FAIL_AT=write:N:ENOSPC (or remove:N:EACCES)
makes the N-th file write (removal) of the process fail with that errno
(patchkit.state.files.fault_point). The write points of a command are listed
by a run that records them; each kind (a backup, the journal, the first, a
middle and the last tree file, a removal, the state, the journal's removal)
is failed once, the errnos taking turns.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from support import PRIMARY, snapshot

from patchkit.state import TEMP_SUFFIX, files

pytestmark = pytest.mark.trees

ERRNOS = ("ENOSPC", "EACCES", "EPERM")


@pytest.fixture
def fail_at(monkeypatch):
    """fail_at(spec): PATCHKIT_TEST_FAIL_AT for the next in-process command, its pass counters reset."""

    def arm(spec: str | None) -> None:
        for label in ("write", "remove"):
            monkeypatch.delenv(f"_PATCHKIT_PATCHKIT_TEST_FAIL_AT_COUNT_{label}", raising=False)
        if spec is None:
            monkeypatch.delenv("PATCHKIT_TEST_FAIL_AT", raising=False)
        else:
            monkeypatch.setenv("PATCHKIT_TEST_FAIL_AT", spec)

    return arm


def write_points(cli, tree: Path, verb: str, monkeypatch) -> list[tuple[str, int, Path]]:
    """Every write and removal ``verb`` makes on ``tree``, in order: (label, its pass, path)."""
    seen, passes = [], Counter()

    def record(label: str, path: Path) -> None:
        passes[label] += 1
        seen.append((label, passes[label], Path(path)))

    with monkeypatch.context() as patched:
        patched.setattr(files, "fault_point", record)
        assert cli(verb, tree).exit_code == 0
    return seen


def kinds(points: list[tuple[str, int, Path]], tree: Path) -> dict[str, tuple[str, int]]:
    """One point of each kind: (label, pass)."""
    state = tree / ".patchkit"
    blobs = [p for p in points if p[2].parent == state / "blobs"]
    in_tree = [p for p in points if p[0] == "write" and state not in p[2].parents]
    chosen = {
        "backup": blobs[len(blobs) // 2] if blobs else None,
        "journal": next(p for p in points if p[2] == state / "journal.json" and p[0] == "write"),
        "first file": in_tree[0],
        "middle file": in_tree[len(in_tree) // 2],
        "last file": in_tree[-1],
        "removal": next((p for p in points if p[0] == "remove" and state not in p[2].parents), None),
        "state": next(p for p in points if p[2] == state / "state.json"),
        "journal removal": next(p for p in points if p[0] == "remove" and p[2] == state / "journal.json"),
    }
    return {kind: point[:2] for kind, point in chosen.items() if point is not None}


def recorded(tree: Path) -> tuple:
    """What the local state records (none: nothing)."""
    state = tree / ".patchkit" / "state.json"
    doc = json.loads(state.read_text()) if state.exists() else {}
    return doc.get("applied", {}), doc.get("files", {})


def temp_files(tree: Path) -> list[Path]:
    return [p for p in tree.rglob(f"*{TEMP_SUFFIX}")]


def assert_rolled_back(result, name: str, tree: Path, before: dict, state_before: tuple) -> None:
    code = getattr(errno, name)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchkit: error: "), result.output
    assert os.strerror(code) in lines[0] and "nothing was changed" in lines[0], lines[0]
    assert snapshot(tree) == before
    assert not (tree / ".patchkit" / "journal.json").exists()
    assert not temp_files(tree)
    assert recorded(tree) == state_before


@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_a_failed_write_at_each_kind_of_point_rolls_back(linked_tree, cli, monkeypatch, fail_at, verb):
    def fresh() -> Path:
        tree = linked_tree(PRIMARY)
        if verb == "revert":
            assert cli("apply", tree).exit_code == 0
        return tree

    probe = fresh()
    points = kinds(write_points(cli, probe, verb, monkeypatch), probe)
    assert {"journal", "first file", "last file", "state", "journal removal"} <= set(points)
    for i, (kind, (label, nth)) in enumerate(points.items()):
        name = ERRNOS[i % len(ERRNOS)]
        tree = fresh()
        before, state_before = snapshot(tree), recorded(tree)
        fail_at(f"{label}:{nth}:{name}")
        assert_rolled_back(cli(verb, tree), name, tree, before, state_before)
        fail_at(None)
        assert cli(verb, tree).exit_code == 0, kind  # the same command, once it can write, does the work
        assert cli("verify", tree).exit_code == (0 if verb == "apply" else 1)
    print(f"{verb}: failed at {', '.join(f'{k} ({at}:{n})' for k, (at, n) in points.items())}; each rolled back")


def test_a_rollback_that_cannot_write_keeps_the_journal_for_revert(linked_tree, cli, monkeypatch, fail_at):
    """The disk stays full: the rollback fails too. The journal stays, the
    line says `patchkit revert` will finish it, and it does."""
    pristine = linked_tree(PRIMARY)
    before = snapshot(pristine)
    in_tree = [
        p
        for p in write_points(cli, pristine, "apply", monkeypatch)
        if p[0] == "write" and ".patchkit" not in p[2].parts
    ]
    tree = linked_tree(PRIMARY)
    fail_at(f"write:{in_tree[2][1]}+:ENOSPC")  # two files written, then nothing can be
    result = cli("apply", tree)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "rolling it back failed too" in result.output and "`patchkit revert` will finish it" in result.output
    assert (tree / ".patchkit" / "journal.json").exists()
    fail_at(None)
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before and not temp_files(tree)
    assert not (tree / ".patchkit" / "journal.json").exists()


def test_blobs_that_is_a_file_is_one_line(linked_tree, cli):
    tree = linked_tree(PRIMARY)
    (tree / ".patchkit").mkdir()
    (tree / ".patchkit" / "blobs").write_text("not a folder")
    before = snapshot(tree)
    result = cli("apply", tree)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"patchkit: error: {tree / '.patchkit' / 'blobs'}: not a folder, where patchkit keeps its backups "
        "(move it away; nothing was changed)"
    ]
    assert snapshot(tree) == before


def test_temp_files_a_kill_left_in_the_blobs_go(linked_tree, cli):
    """A kill while backups are stored leaves .patchkit/blobs/.*.patchkit-tmp: the next command removes them."""
    tree = linked_tree(PRIMARY)
    blobs = tree / ".patchkit" / "blobs"
    blobs.mkdir(parents=True)
    left = [blobs / f".{'a' * 64}.x1{TEMP_SUFFIX}", tree / ".patchkit" / f".state.json.x2{TEMP_SUFFIX}"]
    for path in left:
        path.write_text("half a backup")
    assert cli("apply", tree).exit_code == 0
    assert not temp_files(tree)


def test_a_full_disk_names_the_file(linked_tree, cli, monkeypatch):
    """Issue 68, item 11: a real ENOSPC (from write or fsync, which name no
    file) made the line read `?: cannot write (...)`. Here fsync of the first
    tree file's temp file fails as a full disk's does."""
    tree = linked_tree(PRIMARY)
    before = snapshot(tree)
    fsync = os.fsync

    def full(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(TEMP_SUFFIX) and "/.patchkit/" not in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    result = cli("apply", tree)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"patchkit: error: {tree}/srt/") and "No space left on device" in lines[0], lines[0]
    monkeypatch.setattr(os, "fsync", fsync)
    assert snapshot(tree) == before
