"""Paths stay inside the tree: a manifest, a state, a journal or a patch set
that names a path outside the sglang package, or a symlink leading out of it,
is refused in one line, exit 2, with nothing written or deleted, inside the
tree or out of it (docs/reliability.md, "Paths stay inside the tree")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from support import PRIMARY, snapshot

from patchkit.errors import PatchkitError
from patchkit.state import vendoring
from patchkit.state.files import write_or_remove

pytestmark = pytest.mark.trees

ACME = Path(__file__).resolve().parents[2] / "examples" / "acme-patches" / "acme_patches"
TORCH_NATIVE = "srt/layers/attention/torch_native_backend.py"
FA3 = "srt/layers/attention/flashattention_backend.py"
LOCK = ("lock", ".gitignore")  # what any command makes in .patchkit/ to serialise runs


def assert_refused(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchkit: error: "), result.output
    assert "refused" in lines[0] and all(n in lines[0] for n in needles), lines[0]


def everything(folder: Path, state: bool = True) -> dict[str, str]:
    """sha256 of every file under ``folder`` (.patchkit's state too where ``state``, never its
    lock), and each link's target."""
    return {
        str(p.relative_to(folder)): (
            f"-> {p.readlink()}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(folder.rglob("*"))
        if (p.is_symlink() or p.is_file())
        and not (p.parent.name == ".patchkit" and p.name in LOCK)
        and (state or ".patchkit" not in p.relative_to(folder).parts)
    }


@pytest.fixture
def victim(tmp_path):
    """A file outside every tree, in a folder of its own (which a removal must not take either)."""
    folder = tmp_path / "outside"
    folder.mkdir()
    path = folder / "victim.py"
    path.write_text("x = 1\n")
    return path


def escapes(tree: Path, victim: Path) -> list[str]:
    """``victim`` named from ``tree`` through ``..``, and absolute."""
    return [os.path.relpath(victim, tree), str(victim)]


def rewrite_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.unlink()  # a new file, never one a hard link shares
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_manifest_naming_a_file_outside_is_refused(linked_tree, cli, tmp_path, victim, how):
    """A clone's manifest says patchkit created a file outside the tree: revert
    and apply refuse it, and delete neither it nor its folder."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    shutil.rmtree(tree / ".patchkit")  # a clone: the manifest is all it has
    rel = escapes(tree, victim)[how == "absolute"]
    sha = hashlib.sha256(victim.read_bytes()).hexdigest()
    rewrite_json(tree / vendoring.MANIFEST, lambda d: d["files"].__setitem__(rel, {"before": None, "after": sha}))
    before = everything(tmp_path)
    for command in ("revert", "apply", "status"):
        assert_refused(cli(command, tree), "manifest.json", repr(rel))
    assert everything(tmp_path) == before


def test_a_manifest_calling_a_release_file_created_is_refused(linked_tree, cli):
    """Issue 68, item 11: a manifest entry `{before: null, after: <sha of a
    release file>}` made revert delete that release file. patchkit creates
    files only in its runtime folder."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    shutil.rmtree(tree / ".patchkit")
    sha = hashlib.sha256((tree / TORCH_NATIVE).read_bytes()).hexdigest()
    entry = {"before": None, "after": sha}
    rewrite_json(tree / vendoring.MANIFEST, lambda d: d["files"].__setitem__(TORCH_NATIVE, entry))
    before = snapshot(tree)
    for command in ("revert", "apply", "status"):
        assert_refused(cli(command, tree), "manifest.json", repr(TORCH_NATIVE), "not in its runtime folder")
    assert snapshot(tree) == before


def test_a_state_or_journal_naming_a_file_outside_is_refused(linked_tree, cli, tmp_path, victim):
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    rel = escapes(tree, victim)[0]
    state = tree / ".patchkit" / "state.json"
    rewrite_json(state, lambda d: d["files"].__setitem__(rel, {"original": None, "patched": "0" * 64}))
    before = everything(tmp_path)
    assert_refused(cli("revert", tree), "state.json", repr(rel))
    assert everything(tmp_path) == before

    # A journal (a killed run's) that names it, with the state put back.
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    journal = {
        "verb": "revert",
        "files": [{"file": rel, "before": "0" * 64, "after": None}],
        "state": {"format": 1, "applied": {}, "files": {}},
        "old_state": None,
    }
    (tree / ".patchkit" / "journal.json").write_text(json.dumps(journal))
    before = everything(tmp_path)
    for command in ("revert", "apply"):
        result = cli(command, tree)
        assert result.exit_code == 2, result.output
    assert everything(tmp_path) == before


def test_a_blob_named_by_a_path_is_refused(linked_tree, cli, tmp_path, victim):
    """A sha256 field that is a path never reaches the blobs folder's neighbours."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    rel = next(
        r for r, f in json.loads((tree / ".patchkit" / "state.json").read_text())["files"].items() if f["original"]
    )
    bad = os.path.relpath(victim, tree / ".patchkit" / "blobs")
    rewrite_json(tree / ".patchkit" / "state.json", lambda d: d["files"][rel].__setitem__("original", bad))
    before = everything(tmp_path)
    assert_refused(cli("revert", tree), "state.json", "sha256")
    assert everything(tmp_path) == before


@pytest.mark.parametrize("how", ["dotdot", "absolute", "state"])
def test_a_patch_set_naming_a_file_outside_is_refused(make_tree, cli, tmp_path, how):
    """A vendor's set whose target is outside the package: nothing is written, anywhere."""
    tree = make_tree(PRIMARY)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(tree / TORCH_NATIVE, outside / "victim.py")
    target = {
        "dotdot": "../outside/victim.py",
        "absolute": str(outside / "victim.py"),
        "state": ".patchkit/state.json",
    }[how]
    patch_set = tmp_path / "set"
    patch_set.mkdir()
    shutil.copy(ACME / "torch_native.py", patch_set)
    (patch_set / "evil.toml").write_text(
        f'id = "evil"\ntitle = "t"\nupstream = []\nrequires = []\ndescription = "d"\n'
        f'[[targets]]\nfile = "{target}"\ncodemods = ["torch_native:AddVerifyBuffersHook"]\n'
    )
    before = everything(tmp_path)
    assert_refused(cli("--patches", patch_set, "apply", tree, "evil"), "evil.toml", repr(target))
    assert everything(tmp_path) == before


def test_a_symlinked_folder_is_followed_inside_the_tree_and_refused_out_of_it(make_tree, cli, tmp_path):
    """srt/layers/attention is a link. To a folder inside the package it is
    followed (patched and reverted through); to one outside, patching it would
    write outside the tree: refused."""
    tree = make_tree(PRIMARY)
    attention = tree / "srt" / "layers" / "attention"
    attention.rename(tree / "srt" / "attention-real")
    attention.symlink_to("../attention-real", target_is_directory=True)
    before = everything(tree)
    assert cli("apply", tree).exit_code == 0
    assert attention.is_symlink() and everything(tree, state=False) != before
    assert cli("revert", tree).exit_code == 0
    assert everything(tree, state=False) == before

    outside = tmp_path / "attention-elsewhere"
    (tree / "srt" / "attention-real").rename(outside)
    attention.unlink()
    attention.symlink_to(outside, target_is_directory=True)
    before = everything(tmp_path)
    for command in ("apply", "status"):
        assert_refused(cli(command, tree), "leads out of the sglang package")
    assert everything(tmp_path) == before


def test_a_target_file_that_is_a_symlink_is_refused_and_stays_a_link(make_tree, cli):
    """patchkit replaces files by rename: a link would become a plain file that
    revert cannot give back. So a link is refused, and left as it is."""
    tree = make_tree(PRIMARY)
    link = tree / FA3
    (tree / "srt" / "fa3_real.py").write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to("../../fa3_real.py")
    before = everything(tree)
    assert_refused(cli("apply", tree), FA3, "symbolic link", "--skip")
    assert everything(tree, state=False) == before and link.is_symlink()
    result = cli("apply", tree, "--skip", "fa3-spec-v2", "--skip", "fa3-draft-extend-graph")
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and everything(tree)[FA3] == before[FA3]
    assert cli("revert", tree).exit_code == 0
    assert everything(tree, state=False) == before


def test_folder_clean_up_never_leaves_the_package(tmp_path, victim):
    """Removing a file takes the folders it leaves empty, up to the package and never above it."""
    package = tmp_path / "pkg"
    (package / "a" / "b").mkdir(parents=True)
    (package / "a" / "b" / "f.py").write_text("")
    write_or_remove(package, "a/b/f.py", None)
    assert package.is_dir() and not (package / "a").exists()
    (package / "only.py").write_text("")
    write_or_remove(package, "only.py", None)
    assert package.is_dir()
    for rel in (f"../{victim.parent.name}/{victim.name}", str(victim)):
        with pytest.raises(PatchkitError, match="refused"):
            write_or_remove(package, rel, None)
    assert victim.is_file() and snapshot(tmp_path)
