"""A corrupt or lost journal never costs the originals: every command names
`patchkit revert --recover`, which puts every file back from .patchkit/blobs
alone; half-applied files are never reported `native`. A corrupt state.json
falls back to the manifest (docs/reliability.md, "The journal and recovery",
"Minor")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import PRIMARY, patch_states, pristine_snapshot, snapshot

pytestmark = pytest.mark.trees

RECOVER = "`patchkit revert --recover`"


def crash(tree, verb: str, point: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "patchkit", verb, str(tree)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATCHKIT_TEST_CRASH_AT": point},
    )
    assert result.returncode == 137, (point, result.stderr)


def assert_names_recover(result) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and RECOVER in lines[0], result.output


# Where an apply of the primary release can die: after the journal, after
# the first, a middle and the last of its 28 writes (the manifest), after the state.
POINTS = {"corrupt": ["journal", "file:1", "file:14", "state"], "removed": ["file:14", "file:28"]}


@pytest.mark.parametrize("damage", ["corrupt", "removed"])
def test_after_a_crash_at_each_point_recover_puts_back_every_original(linked_tree, cli, damage):
    """Killed at each point of an apply, then the journal truncated (or
    removed by hand, as the old advice said): no command calls a half-applied
    patch native; `revert --recover` gives back the pristine tree, and the
    tree patches again."""
    for point in POINTS[damage]:
        tree = linked_tree(PRIMARY)
        crash(tree, "apply", point)
        journal = tree / ".patchkit" / "journal.json"
        if damage == "corrupt":
            journal.write_text(journal.read_text()[:40])
        else:
            journal.unlink()
        before = snapshot(tree)
        for command in ("status", "apply"):
            result = cli(command, tree)
            if damage == "corrupt" or result.exit_code != 0:  # all written, the manifest too: it is believed
                assert_names_recover(result)
            assert "native" not in result.output, (point, command)
        assert snapshot(tree) == before
        recovered = cli("revert", tree, "--recover")
        assert recovered.exit_code == 0, (point, recovered.output)
        assert snapshot(tree) == pristine_snapshot(PRIMARY), point
        assert not journal.exists()
        if damage == "corrupt":
            assert any(p.name.startswith("journal-") for p in (tree / ".patchkit" / "set-aside").iterdir())
    assert cli("apply", tree).exit_code == 0 and cli("verify", tree).exit_code == 0


def test_recover_after_a_crashed_revert(linked_tree, cli, monkeypatch):
    """A killed revert; then a --recover whose own write fails (rolled back:
    the damaged journal is back in place, so every command still names
    --recover), then one that succeeds."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    crash(tree, "revert", "file:10")
    (tree / ".patchkit" / "journal.json").write_text("{")
    assert_names_recover(cli("apply", tree))
    before = snapshot(tree)
    with monkeypatch.context() as faulty:
        faulty.setenv("PATCHKIT_TEST_FAIL_AT", "write:3:ENOSPC")
        faulty.delenv("_PATCHKIT_PATCHKIT_TEST_FAIL_AT_COUNT_write", raising=False)
        failed = cli("revert", tree, "--recover")
    assert failed.exit_code == 2 and "rolled back" in failed.output, failed.output
    assert snapshot(tree) == before
    assert_names_recover(cli("status", tree))
    assert cli("revert", tree, "--recover").exit_code == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def test_recover_leaves_a_file_edited_since_and_says_so(linked_tree, cli):
    tree = linked_tree(PRIMARY)
    crash(tree, "apply", "file:3")
    (tree / ".patchkit" / "journal.json").write_text("{")
    journal_files = [rel for rel, sha in snapshot(tree).items() if pristine_snapshot(PRIMARY).get(rel) != sha]
    edited = tree / journal_files[0]
    text = edited.read_text() + "# mine\n"
    edited.unlink()  # a hard link to the cache: a new file
    edited.write_text(text)
    result = cli("revert", tree, "--recover")
    assert result.exit_code == 0, result.output
    assert "holds bytes patchkit never wrote" in result.output and journal_files[0] in result.output
    assert edited.read_text() == text
    now, pristine = snapshot(tree), pristine_snapshot(PRIMARY)
    assert {rel for rel in pristine if now.get(rel) != pristine[rel]} == {journal_files[0]}


def test_a_corrupt_state_falls_back_to_the_manifest(linked_tree, cli):
    """The manifest says what was applied: revert goes on, and the state is set aside (kept)."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    state = tree / ".patchkit" / "state.json"
    state.write_text("{not json")
    result = cli("revert", tree)
    assert result.exit_code == 0, result.output
    assert "set aside" in result.output
    assert snapshot(tree) == pristine_snapshot(PRIMARY)

    tree = linked_tree(PRIMARY)  # no manifest either: one line naming the remedy, which works
    assert cli("apply", tree).exit_code == 0
    (tree / ".patchkit" / "state.json").write_text("{not json")
    (tree / "srt" / "_patchkit" / "manifest.json").unlink()
    assert_names_recover(cli("revert", tree))
    assert cli("revert", tree, "--recover").exit_code == 0
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def test_no_native_while_a_journal_is_pending(linked_tree, cli):
    """Issue 68, item 6: after a crash mid-commit, `status` said 3 patches
    `native` with `ok: true`; the journal is readable, so the tree is
    half-written by patchkit, not the release's code."""
    tree = linked_tree(PRIMARY)
    crash(tree, "apply", "file:14")
    states = {pid: p["state"] for pid, p in patch_states(cli, tree).items()}
    assert "native" not in states.values() and "partial" in states.values(), states
    assert cli("verify", tree).exit_code == 1


def test_no_native_where_patchkits_work_is_without_its_record(linked_tree, cli):
    """Issue 68, item 6: with `.patchkit/` and the manifest deleted from a
    patched tree, every patch read `native`, `verify` was OK and `revert`
    changed 0 files, while the vendored runtime and its imports were there."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    shutil.rmtree(tree / ".patchkit")
    (tree / "srt" / "_patchkit" / "manifest.json").unlink()
    assert "native" not in {p["state"] for p in patch_states(cli, tree).values()}
    assert "no record of it" in cli("status", tree).output
    assert cli("verify", tree).exit_code == 1
    before = snapshot(tree)
    for command in ("revert", "apply"):
        result = cli(command, tree)
        assert result.exit_code == 2 and "no record of it" in result.output, result.output
    assert snapshot(tree) == before

    shutil.rmtree(tree / "srt" / "_patchkit")  # the imports of it alone say so too
    assert "native" not in {p["state"] for p in patch_states(cli, tree).values()}


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_recover_without_its_backups_finds_the_originals(linked_tree, cli, damage):
    """Issue 68, item 11: with the blobs missing or corrupt, `revert --recover`
    advised "fetch it from git" even in a package layout. The originals are
    looked for where a clone finds them (the release, git history)."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    (tree / ".patchkit" / "journal.json").write_text("{")
    for blob in (tree / ".patchkit" / "blobs").iterdir():
        if damage == "missing":
            blob.unlink()
        else:
            blob.write_bytes(b"not the backup")
    result = cli("revert", "--recover", tree)
    assert result.exit_code == 0 and "git" not in result.output, result.output
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
