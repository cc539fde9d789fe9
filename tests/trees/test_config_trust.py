"""A config never decides what code runs unasked (issue 68, item 4): the
patch sets a ``pyproject.toml`` names load on ``apply`` and ``revert`` only,
only from TREE's own repository, only folders inside it, and, in another
user's repository, only where git's ``safe.directory`` trusts it. Read
commands say a set is configured and how to load it, and import nothing.

Each set here leaves a file ``imported`` beside it when its codemods are
imported: the one witness that matters."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import PRIMARY, snapshot

pytestmark = pytest.mark.trees

SET = Path(__file__).resolve().parents[2] / "examples" / "acme-patches" / "acme_patches"
PATCH = "acme-torch-native-spec-v2"


def witnessed_set(folder: Path) -> Path:
    shutil.copytree(SET, folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(folder / "torch_native.py", "a") as fh:
        fh.write('\n\nfrom pathlib import Path\n\nPath(__file__).with_name("imported").touch()\n')
    return folder


@pytest.fixture
def fork(make_tree):
    """A checkout whose pyproject.toml names its own set, acme/."""
    fork = make_tree(PRIMARY, "checkout")
    witnessed_set(fork / "acme")
    (fork / "pyproject.toml").write_text('[tool.patchkit]\npatches = ["acme"]\n')
    return fork


def test_read_commands_never_import_a_configured_set(fork, cli):
    """``status`` and ``verify`` imported the set a tree's pyproject names."""
    for command in (["status"], ["verify"], ["diff"], ["audit"], ["export", "--stdout"]):
        result = cli(*command, fork)
        assert f"note: {fork / 'pyproject.toml'} names patch sets" in result.output, (command, result.output)
        assert f"load them with --patches {fork / 'acme'}" in result.output
    assert not (fork / "acme" / "imported").exists()
    assert cli("apply", fork, PATCH).exit_code == 0  # apply loads it
    assert (fork / "acme" / "imported").exists()


def test_a_pyproject_outside_the_trees_repository_is_ignored(make_tree, cli, tmp_path, monkeypatch):
    """A pyproject.toml above the current folder, or above the tree's
    repository, named sets for any TREE."""
    outside = witnessed_set(tmp_path / "acme")
    (tmp_path / "pyproject.toml").write_text(f'[tool.patchkit]\npatches = ["{outside}"]\n')
    fork = make_tree(PRIMARY, "checkout")
    subprocess.run(["git", "init", "-q", fork], check=True)  # the repository ends at the fork
    monkeypatch.chdir(tmp_path)
    for command in ("status", "apply", "revert"):
        result = cli(command, fork)
        assert result.exit_code == 0 and "names patch sets" not in result.output, result.output
    assert "unknown patch" in cli("apply", fork, PATCH).output
    assert not (outside / "imported").exists()


@pytest.mark.parametrize("named", ["outside", "../..", "/"])
def test_a_config_loads_only_folders_inside_its_repository(fork, cli, tmp_path, named):
    outside = witnessed_set(tmp_path / "outside")
    listed = str(outside) if named == "outside" else named
    (fork / "pyproject.toml").write_text(f'[tool.patchkit]\npatches = ["{listed}"]\n')
    before = snapshot(fork / "python" / "sglang")
    result = cli("apply", fork)
    out = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(out) == 1 and "outside the repository" in out[0], result.output
    assert snapshot(fork / "python" / "sglang") == before and not (outside / "imported").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give the repository to another user")
def test_another_users_repository_loads_only_where_safe_directory_names_it(fork, cli, tmp_path, monkeypatch):
    subprocess.run(["chown", "-R", "65534:65534", fork], check=True)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    result = cli("apply", fork)
    assert result.exit_code == 0 and "is owned by uid 65534, not by you (uid 0)" in result.output, result.output
    assert f"git config --global --add safe.directory {fork}" in result.output
    assert not (fork / "acme" / "imported").exists()
    assert cli("revert", fork).exit_code == 0
    subprocess.run(["git", "config", "--global", "--add", "safe.directory", str(fork)], check=True)
    assert cli("apply", fork, PATCH).exit_code == 0
    assert (fork / "acme" / "imported").exists()
