"""Shell completion (bash, zsh, fish; click's): subcommands, and patch ids
for [TREE] [PATCH]..., --skip and show PATCH; folders only where the first
argument may be the TREE (by the shell where it reads as a path); never a
stray `dir` entry beside the ids."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.shell_completion import BashComplete

from patchkit import registry
from patchkit.cli import main

IDS = [p.id for p in registry.all_patches()]
SET = Path(__file__).resolve().parents[2] / "examples" / "acme-patches" / "acme_patches"
COMMANDS = ["apply", "audit", "diff", "export", "fetch", "list", "matrix", "revert", "show", "status", "verify"]


def complete(*args: str, incomplete: str = "") -> list[tuple[str, str]]:
    found = BashComplete(main, {}, "patchkit", "_PATCHKIT_COMPLETE").get_completions(list(args), incomplete)
    return [(item.type, item.value) for item in found]


@pytest.fixture(autouse=True)
def _in_an_empty_folder(tmp_path, monkeypatch):
    (tmp_path / "mytree").mkdir()
    monkeypatch.chdir(tmp_path)


def test_subcommands():
    assert [value for _, value in complete()] == COMMANDS
    assert complete(incomplete="re") == [("plain", "revert")]


def test_patch_ids_and_tree_folders_for_the_first_argument():
    assert complete("apply") == [("plain", i) for i in IDS] + [("plain", "mytree/")]
    assert complete("status", incomplete="trtllm-mha") == [("plain", i) for i in IDS if i.startswith("trtllm-mha")]
    assert complete("verify", incomplete="my") == [("plain", "mytree/")]
    assert complete("apply", incomplete="./") == [("dir", "./")]  # a path: the shell completes folders


def test_later_arguments_are_patch_ids_not_given_yet():
    assert complete("apply", "mytree") == [("plain", i) for i in IDS]
    assert complete("revert", IDS[0]) == [("plain", i) for i in IDS[1:]]
    assert complete("apply", "--skip", IDS[1], "--skip") == [("plain", i) for i in IDS if i != IDS[1]]
    assert complete("show") == [("plain", i) for i in IDS]
    assert complete("apply", "not-a-patch") == [("plain", i) for i in IDS]  # no error while completing


def test_sets_named_by_patches_complete_too():
    assert ("plain", "acme-torch-native-spec-v2") in complete("--patches", str(SET), "apply", incomplete="acme")
    assert complete("apply", incomplete="acme") == []
    assert "acme-torch-native-spec-v2" not in {p.id for p in registry.all_patches()}  # nothing left loaded


@pytest.mark.parametrize(
    "shell, words, separator",
    [
        ("bash", {"COMP_WORDS": "patchkit show ", "COMP_CWORD": "2"}, ","),
        ("zsh", {"COMP_WORDS": "patchkit show ", "COMP_CWORD": "2"}, "\n"),
        ("fish", {"COMP_WORDS": "patchkit show ", "COMP_CWORD": ""}, ","),
    ],
)
def test_each_shell_gets_the_ids_and_a_script(shell, words, separator):
    def run(mode: str, **env: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "patchkit"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "_PATCHKIT_COMPLETE": f"{shell}_{mode}", **env},
        ).stdout

    assert "_PATCHKIT_COMPLETE" in run("source")
    out = run("complete", **words)
    for pid in IDS:
        assert f"plain{separator}{pid}" in out
    assert "dir" not in out
