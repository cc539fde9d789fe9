"""git-like habits of the command line: TREE found from the current folder,
diff --stat / --name-only / PATCH..., show, -v saying where it means something,
environment variables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import PRIMARY, pristine_snapshot, snapshot

from patchkit import registry

HOOK = "trtllm-mha-overlap-hook"
MHA = "python/sglang/srt/layers/attention/trtllm_mha_backend.py"


def lines(result) -> list[str]:
    return result.output.strip().splitlines()


@pytest.mark.parametrize("where", [".", "python", "python/sglang", "python/sglang/srt/layers", "docs"])
def test_no_tree_argument_finds_the_tree_upward(make_tree, cli, monkeypatch, where):
    root = make_tree(PRIMARY, "checkout")
    (root / "docs").mkdir()  # a folder of the checkout outside python/, as git would find it
    monkeypatch.chdir(root / where)
    package = root / "python" / "sglang"
    status = cli("status")
    assert status.exit_code == 0, status.output
    assert lines(status)[0].startswith(f"sglang {PRIMARY} at {package} (")
    applied = cli("apply", HOOK)  # a patch id alone: the tree is the current folder's
    assert applied.exit_code == 0, applied.output
    # No TREE given: the first line says which tree was taken (as verify's does).
    assert lines(applied)[0].startswith(f"sglang {PRIMARY} at {package} (") and lines(applied)[1] == f"applied: {HOOK}"
    assert cli("verify", HOOK).exit_code == 0
    assert cli("revert").exit_code == 0
    assert snapshot(package) == pristine_snapshot(PRIMARY)


@pytest.mark.parametrize("layout", ["package", "python", "checkout"])
def test_each_form_and_a_subfolder_given_as_tree(make_tree, cli, layout):
    given = make_tree(PRIMARY, layout)
    package = given if layout == "package" else given / "sglang" if layout == "python" else given / "python/sglang"
    for tree in (given, package / "srt" / "layers"):
        result = cli("status", tree, HOOK)
        assert result.exit_code == 0 and lines(result)[0].startswith(f"sglang {PRIMARY} at {package} ("), result.output


@pytest.mark.parametrize("args", [(), ("status",), ("apply",), ("diff", "--stat"), ("export", "--stdout")])
def test_outside_any_tree_is_one_line_exit_2(cli, monkeypatch, tmp_path, args):
    monkeypatch.chdir(tmp_path)
    result = cli(*(args or ("verify",)))
    assert result.exit_code == 2, result.output
    assert lines(result) == [lines(result)[0]] and lines(result)[0].startswith(f"patchkit: error: {tmp_path}: ")
    assert "not an sglang tree, nor inside one" in result.output


def test_diff_stat_name_only_and_patch_filter(make_tree, cli):
    root = make_tree(PRIMARY, "checkout")
    assert cli("apply", root).exit_code == 0
    names = lines(cli("diff", root, "--name-only"))
    assert MHA in names and "python/sglang/srt/_patchkit/manifest.json" in names
    assert all(not n.startswith(("---", "+++", "@@")) for n in names)
    stat = lines(cli("diff", root, "--stat"))
    assert stat[-1].startswith(f" {len(names)} files changed, ") and "insertions(+)" in stat[-1]
    assert any(line.startswith(f" {MHA} ") and "|" in line for line in stat)
    only = cli("diff", root, HOOK, "--name-only")
    assert lines(only) == [MHA]  # the files of that patch, not the runtime folder
    full = cli("diff", root, HOOK).output
    assert (
        full.startswith(f"--- a/{MHA}\n+++ b/{MHA}\n") and "+    def update_verify_buffers_to_fill_after_draft(" in full
    )
    both = cli("diff", root, "--stat", "--name-only")
    assert both.exit_code == 2 and "at most one of --stat and --name-only" in both.output
    unknown = cli("diff", root, "no-such-patch")
    assert unknown.exit_code == 2 and "unknown patch 'no-such-patch'" in unknown.output


def test_show_says_what_a_patch_changes(make_tree, cli):
    result = cli("show", "trtllm-mla-spec-v2")
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.startswith("trtllm-mla-spec-v2: TRT-LLM MLA")
    assert "upstream: sglang#26824" in text and "requires: needs-cpu-seq-lens" in text and "from:     patchkit" in text
    patch = registry.by_id("trtllm-mla-spec-v2")
    for target in patch.targets:  # every file, and what each of its codemods does
        assert f"\n  {target.file}" in text
        for codemod in target.codemods:
            assert f"    - {' '.join(codemod.DESCRIPTION.split())}" in text
    tree = make_tree()
    before = snapshot(tree)
    diff = cli("show", HOOK, tree, "--diff")
    assert diff.exit_code == 0 and "+    def update_verify_buffers_to_fill_after_draft(" in diff.output
    assert snapshot(tree) == before  # read only
    assert cli("apply", tree, HOOK).exit_code == 0
    after = cli("show", HOOK, tree, "--diff", "--format", "json")
    assert '"schema": "patchkit.show/1"' in after.output and "update_verify_buffers_to_fill_after_draft" in after.output
    assert cli("show", HOOK, tree).exit_code == 2  # a TREE without --diff is a usage error
    assert cli("show", "nope").exit_code == 2


def test_verbose_says_where_it_changes_output_and_every_option_has_help(cli):
    # -q and -v on every command (tests/trees/test_terminal.py); the help says where -v adds nothing.
    for command in ("fetch", "diff", "list", "show", "apply", "revert", "export", "matrix"):
        assert "none to add: accepted, no effect" in " ".join(cli(command, "--help").output.split()), command
    for command in ("status", "verify", "audit"):
        assert "none to add" not in " ".join(cli(command, "--help").output.split()), command
    for command in ("list", "status", "apply", "revert", "verify", "diff", "show", "export", "matrix", "fetch"):
        text = cli(command, "--help").output
        options = [line for line in text.split("Options:")[1].splitlines() if line.strip().startswith("-")]
        assert options and all(
            len(line.split("  ")) > 1 and line.split("  ", 1)[1].strip()
            for line in options
            if not line.strip().endswith("]")
        ), (command, options)


def test_environment_variables_in_help_and_checked(cli, make_tree, tmp_path):
    from patchkit import settings

    text = cli("--help").output
    documented = (Path(__file__).resolve().parents[2] / "docs" / "ci.md").read_text()
    assert all(f"`{name}`" in documented for name in [*settings.VARIABLES, *settings.DEPRECATED])
    for name in (
        "PATCHKIT_LOCK_TIMEOUT",
        "PATCHKIT_JOBS",
        "PATCHKIT_CACHE_DIR",
        "PATCHKIT_TRANSFORM_CACHE",
        "PATCHKIT_CACHE",
        "_PATCHKIT_COMPLETE=bash_source patchkit",
    ):
        assert name in text
    a_file = tmp_path / "file"
    a_file.write_text("")
    tree = make_tree()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    for variable, value, needle in (
        ("PATCHKIT_CACHE_DIR", str(a_file), "not a folder"),
        ("PATCHKIT_TRANSFORM_CACHE", str(a_file), "not a folder"),
        ("PATCHKIT_JOBS", "many", "not a positive whole number"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "patchkit", "status", str(tree)],
            capture_output=True,
            text=True,
            env={**env, variable: value},
        )
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and needle in run.stderr, run.stderr
    # The old name still moves the cache folder, with one note (a cache entry
    # is made by hand: nothing is downloaded).
    cached = tmp_path / "old-cache" / "trees" / PRIMARY
    (cached / "sglang").mkdir(parents=True)
    (cached / ".complete").write_text("by the test")
    run = subprocess.run(
        [sys.executable, "-m", "patchkit", "fetch", PRIMARY],
        capture_output=True,
        text=True,
        env={**env, "PATCHKIT_CACHE": str(tmp_path / "old-cache")},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tmp_path / "old-cache" / "trees" / PRIMARY / "sglang")
    assert "PATCHKIT_CACHE is deprecated: use PATCHKIT_CACHE_DIR" in run.stderr


def test_completion_script_names_the_commands():
    run = subprocess.run(
        [sys.executable, "-c", "from patchkit.cli import main; main(prog_name='patchkit')"],
        capture_output=True,
        text=True,
        env={**os.environ, "_PATCHKIT_COMPLETE": "bash_source"},
    )
    assert run.returncode == 0 and "_patchkit_completion" in run.stdout
    run = subprocess.run(
        [sys.executable, "-c", "from patchkit.cli import main; main(prog_name='patchkit')"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "_PATCHKIT_COMPLETE": "bash_complete",
            "COMP_WORDS": "patchkit show trtllm-mha",
            "COMP_CWORD": "2",
        },
    )
    assert "plain,trtllm-mha-overlap-hook" in run.stdout and "plain,trtllm-mha-draft-extend-v2" in run.stdout


def test_readme_shows_what_the_demo_and_ci_run():
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    transcript = readme.split("`bash scripts/demo.sh` prints exactly this")[1].split("```")[1]
    demo = (root / "scripts" / "demo.sh").read_text()
    assert re.findall(r"^\$ (patchkit .*)$", transcript, re.M) == re.findall(r"^say (patchkit .*)$", demo, re.M)
    test_command = readme.split("Set up and run the tests")[1].split("\n\n")[1].strip()
    assert test_command in (root / ".ci" / "run").read_text()
    assert len(readme.encode()) <= 12_500  # about 12 KB, for users; results live in docs/


def test_quiet_prints_no_notes(make_tree, cli):
    """-q: results and errors only; 0.5.12.post1 lacks optional files, which
    status and verify note under their patch. Nor the tree line, nor (once
    applied) the "patched by" line (issue 54)."""
    tree = make_tree(PRIMARY)
    assert "note: " in cli("status", tree).output
    assert cli("apply", tree).exit_code == 0
    assert "patched by patchkit" in cli("status", tree).output
    for args in (("-q", "status", tree), ("status", "-q", tree), ("-q", "verify", tree)):
        result = cli(*args)
        assert "note:" not in result.output and f"sglang {PRIMARY} at" not in result.output, result.output
        assert "patched by" not in result.output and "  needs-cpu-seq-lens" in result.output, result.output


def test_a_copied_package_under_another_name_is_a_tree(make_tree, cli, monkeypatch):
    """A copy of the sglang/ folder renamed (it keeps __init__.py, srt/ and
    its version file) is a tree of the package layout, by path or from inside."""
    tree = make_tree(PRIMARY)
    mine = tree.rename(tree.parent / "my-sglang-copy")
    result = cli("status", mine, HOOK)
    assert result.exit_code == 0 and lines(result)[0] == f"sglang {PRIMARY} at {mine} (package layout)", result.output
    monkeypatch.chdir(mine / "srt" / "layers")
    assert lines(cli("status", HOOK))[0] == f"sglang {PRIMARY} at {mine} (package layout)"
    (mine / "_version.py").unlink()
    (mine / "version.py").unlink(missing_ok=True)
    missing = cli("status", mine)
    assert missing.exit_code == 2 and "__init__.py" in missing.output and "named sglang" in missing.output


def test_help_says_why_diffs_use_the_git_layout(cli):
    for command in ("apply", "revert", "diff", "show"):
        text = " ".join(cli(command, "--help").output.split())
        assert "a/python/sglang/srt/" in text and "`git apply`" in text and "-p3" in text, command
