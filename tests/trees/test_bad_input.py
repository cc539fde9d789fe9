"""Bad input: one clear line on stderr, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import PRIMARY, pristine_snapshot, snapshot

MHA = "srt/layers/attention/trtllm_mha_backend.py"


def assert_one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchkit: error: "), result.output
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("command", ["status", "apply", "revert", "verify", "diff"])
def test_not_a_tree(tmp_path, cli, command):
    assert_one_line_error(cli(command, tmp_path), "not an sglang tree", "base_attn_backend.py")
    assert list(tmp_path.iterdir()) == []


def test_missing_path_and_file(tmp_path, cli):
    assert_one_line_error(cli("status", tmp_path / "nope"), "no such file")
    f = tmp_path / "f.py"
    f.write_text("x = 1\n")
    assert_one_line_error(cli("apply", f), "not a folder")


def test_unknown_patch(cli, make_tree):
    tree = make_tree(PRIMARY)
    assert_one_line_error(cli("apply", tree, "no-such-patch"), "unknown patch 'no-such-patch'")


@pytest.mark.trees
def test_syntax_error_in_target(make_tree, cli):
    tree = make_tree(PRIMARY)
    (tree / MHA).write_text((tree / MHA).read_text() + "\ndef broken(:\n")
    before = snapshot(tree)
    assert_one_line_error(cli("apply", tree), MHA, "syntax error")
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("which", ["file", "folder"])
def test_read_only_target(make_tree, cli, which):
    # Also as root (CI), where chmod does not stop writes: a file or folder the
    # user marked read-only is refused all the same.
    tree = make_tree(PRIMARY)
    os.chmod(tree / MHA if which == "file" else (tree / MHA).parent, 0o444 if which == "file" else 0o555)
    before = snapshot(tree)
    named = MHA if which == "file" else str(Path(MHA).parent)
    assert_one_line_error(cli("apply", tree), named, f"read-only {which}")
    assert snapshot(tree) == before
    os.chmod((tree / MHA).parent, 0o755)


@pytest.mark.trees
def test_read_only_folder_for_the_runtime(make_tree, cli):
    # No target file lives directly in srt/, but the vendored runtime folder is
    # created there: refused before any write, not half-way through the commit.
    tree = make_tree(PRIMARY)
    os.chmod(tree / "srt", 0o555)
    before = snapshot(tree)
    assert_one_line_error(cli("apply", tree), str(tree / "srt") + ":", "read-only folder")
    assert snapshot(tree) == before
    os.chmod(tree / "srt", 0o755)


@pytest.mark.trees
@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "corrupt patchkit state"),
        (json.dumps({"format": 99, "applied": {}, "files": {}}), "newer patchkit"),
    ],
)
def test_corrupt_or_newer_state(make_tree, cli, content, needle):
    tree = make_tree(PRIMARY)
    (tree / ".patchkit").mkdir()
    (tree / ".patchkit" / "state.json").write_text(content)
    before = snapshot(tree)
    assert_one_line_error(cli("apply", tree), "state.json", needle)
    assert snapshot(tree) == before


@pytest.mark.parametrize("command", ["apply", "status", "revert", "verify", "diff"])
def test_neither_a_tree_nor_a_patch_names_the_argument(cli, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(
        cli(command, "does-not-exist"),
        "does-not-exist: no tree there (no such file or folder) and no patch of that name",
        "needs-cpu-seq-lens",
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["apply", "--runtime", "bogus"], "'--runtime': 'bogus' is not one of"),
        (["--bogus", "list"], "'--bogus'"),
        (["nosuch"], "'nosuch'"),
        (["show"], "'PATCH'"),
        (["diff", "--stat", "--name-only"], "--stat and --name-only"),
        (["matrix", "-j", "0"], "'-j' / '--jobs'"),
    ],
)
def test_usage_errors_are_one_line_naming_the_argument(cli, args, needle):
    assert_one_line_error(cli(*args), needle, "-h`)")


@pytest.mark.parametrize(
    "variable, value, needle",
    [
        ("PATCHKIT_LOCK_TIMEOUT", "-1", "out of range; allowed: 0 (do not wait) or more seconds, finite"),
        ("PATCHKIT_LOCK_TIMEOUT", "inf", "out of range; allowed: 0"),
        ("PATCHKIT_LOCK_TIMEOUT", "soon", "not a number of seconds; allowed: 0"),
        ("PATCHKIT_JOBS", "0", "allowed: 1 or more"),
    ],
)
def test_bad_environment_values_say_what_is_allowed(cli, monkeypatch, variable, value, needle):
    monkeypatch.setenv(variable, value)
    assert_one_line_error(cli("list"), f"{variable}={value!r}", needle)


def test_an_error_after_the_tree_is_found_prints_no_tree_line(make_tree, cli, monkeypatch):
    """The tree line ("sglang X at P") waits for the command's first output:
    an error found after the tree (a bad patch id) is still one line."""
    tree = make_tree(PRIMARY)
    monkeypatch.chdir(tree / "srt")  # found upward: the line would be printed
    assert_one_line_error(cli("apply", "trtllm-mha-overlap-hook", "nope"), "unknown patch 'nope'")
    assert_one_line_error(cli("revert", "nope"), "nope")
    found = cli("status", "trtllm-mha-overlap-hook")
    assert found.exit_code == 0 and found.output.startswith(f"sglang {PRIMARY} at {tree} (package layout)\n")


@pytest.mark.trees
def test_a_missing_file_is_named_once(make_tree, cli):
    tree = make_tree(PRIMARY)
    (tree / MHA).unlink()
    result = cli("status", tree, "trtllm-mha-overlap-hook")
    line = next(line for line in result.output.splitlines() if "trtllm-mha-overlap-hook " in line)
    assert f"({MHA}: file not in this tree; verify fails on it)" in line and line.count(MHA) == 1, line
    verify = cli("verify", tree, "trtllm-mha-overlap-hook")
    assert verify.exit_code == 1 and not any(line.count(MHA) > 1 for line in verify.output.splitlines()), verify.output


def test_a_manifest_nested_too_deeply_is_one_line(linked_tree, cli):
    """A manifest of ``'[' * 200000`` was a RecursionError out of every
    command, ``--recover`` included: the tree could not be managed."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree, "trtllm-mha-overlap-hook").exit_code == 0
    manifest = tree / "srt/_patchkit/manifest.json"
    manifest.write_text("[" * 200000)
    for command in ("status", "verify", "diff", "apply", "revert"):
        assert_one_line_error(cli(command, tree), str(manifest), "corrupt patchkit manifest")
    recovered = cli("revert", tree, "--recover")
    assert recovered.exit_code == 0 and "manifest.json: holds bytes patchkit never wrote" in recovered.output
    manifest.unlink()  # the one file it leaves, named
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


@pytest.mark.trees
def test_a_read_only_tree_still_answers_what_writes_nothing(make_tree, cli):
    """Issue 68, item 11: a read-only tree refused `apply --dry-run`, `apply
    --check` and `show P --diff T`, which write nothing; they answer, and say
    where the run itself would stop. (Mode bits: root writes through them,
    patchkit does not, as on a read-only mount.)"""
    tree = make_tree(PRIMARY)
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
    os.chmod(tree / "srt", 0o555)
    before = snapshot(tree)
    dry = cli("apply", "--dry-run", tree)
    assert dry.exit_code == 0 and "would be applied" in dry.output and "read-only" in dry.output, dry.output
    assert cli("apply", "--check", tree).exit_code == 1
    shown = cli("show", "trtllm-mha-overlap-hook", "--diff", tree)
    assert shown.exit_code == 0 and "+++ b/python/sglang/srt/layers/attention/trtllm_mha_backend.py" in shown.output
    assert_one_line_error(cli("apply", tree), "read-only")
    assert snapshot(tree) == before
    os.chmod(tree / "srt", 0o755)
