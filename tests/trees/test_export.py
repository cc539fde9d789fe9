"""patchkit export: a git format-patch series that `git am` applies to a
pristine checkout, reproducing the patched tree byte for byte."""

from __future__ import annotations

import importlib.resources
import os
import re
import subprocess
from pathlib import Path

import libcst as cst
import pytest
from support import NATIVE, PRIMARY, pristine, snapshot

from patchkit import registry
from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding
from patchkit.registry import Patch, Target

pytestmark = pytest.mark.trees

MHA = "srt/layers/attention/trtllm_mha_backend.py"
BASE = "srt/layers/attention/base_attn_backend.py"
HOOK = "trtllm-mha-overlap-hook"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def pristine_repo(tmp_path: Path, version: str = PRIMARY) -> Path:
    repo = tmp_path / "repo"
    (repo / "python").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(pristine(version)), str(repo / "python" / "sglang")], check=True)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pristine")
    return repo


# --- a synthetic second patch: requires the hook, touches the same file and one more


class MarkMHA(ClassCodemod):
    DESCRIPTION = "test: a class attribute on TRTLLMHAAttnBackend"
    CLASS = "TRTLLMHAAttnBackend"
    REQUIRED_TEXT = (CLASS,)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        found = primitives.find_class_attribute(cls, "exported_marker")
        return Finding.done(self.CLASS) if found else Finding.todo(self.CLASS)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        return primitives.add_class_attribute(cls, "exported_marker: bool = True")


class MarkBase(MarkMHA):
    CLASS = "AttentionBackend"
    REQUIRED_TEXT = (CLASS,)


SECOND = Patch(
    "test-second",
    "Test: second patch, same file and one more",
    ("sglang#2",),
    (HOOK,),
    "Test only.\n---\nFrom here on a line git would take for the diff.",
    (Target(BASE, (MarkBase,)), Target(MHA, (MarkMHA,))),
)


def load_patch(pid: str) -> Patch:
    text = (importlib.resources.files("patchkit.patches") / f"{pid}.toml").read_text(encoding="utf-8")
    return registry._parse(text, f"{pid}.toml")


@pytest.fixture
def two_patches(monkeypatch):
    patches = (load_patch(HOOK), SECOND)
    monkeypatch.setattr(registry, "all_patches", lambda: patches)
    return patches


def test_series_of_two_git_am_byte_identical(make_tree, cli, tmp_path, two_patches, monkeypatch):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1780000000")
    out = tmp_path / "series"
    result = cli("export", tree, "--out", out, "--author", "Fork Bot <bot@fork.example>")
    assert result.exit_code == 0, result.output
    names = [f"0001-{HOOK}.patch", "0002-test-second.patch"]
    assert sorted(p.name for p in out.glob("*.patch")) == names
    assert (out / "series").read_text().split() == names

    first, second = ((out / n).read_text() for n in names)
    assert first.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "From: Fork Bot <bot@fork.example>\n" in first
    assert "Date: Thu, 28 May 2026 20:26:40 -0000\n" in first
    assert f"Subject: [PATCH 1/2] {registry.by_id(HOOK).title}\n" in first
    assert "https://github.com/sgl-project/sglang/pull/25925 (sglang#25925)" in first
    assert "Subject: [PATCH 2/2] Test: second patch, same file and one more\n" in second
    assert "Requires: trtllm-mha-overlap-hook" in second
    # patch 1 carries only the hook; patch 2 only the markers (on top of patch 1)
    assert f"a/python/sglang/{MHA}" in first and BASE not in first
    assert "exported_marker" not in first and "update_verify_buffers_to_fill_after_draft" in first
    assert f"a/python/sglang/{BASE}" in second and f"a/python/sglang/{MHA}" in second
    assert "+    def update_verify_buffers" not in second

    repo = pristine_repo(tmp_path)
    git(repo, "am", *[str(out / n) for n in names])
    log = git(repo, "log", "--format=%an|%s|%b", "-2").split("\n")
    assert log[0].startswith("Fork Bot|Test: second patch")
    body = git(repo, "log", "-1", "--format=%b")
    assert "From here on a line git would take for the diff." in body and "Patchkit-Patch: test-second" in body
    assert snapshot(repo / "python" / "sglang") == snapshot(tree)


def test_applied_in_two_steps(make_tree, cli, tmp_path, two_patches):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, HOOK).exit_code == 0
    assert cli("apply", tree).exit_code == 0
    out = tmp_path / "out"
    assert cli("export", tree, "--out", out).exit_code == 0
    repo = pristine_repo(tmp_path)
    git(repo, "am", *map(str, sorted(out.glob("*.patch"))))
    assert snapshot(repo / "python" / "sglang") == snapshot(tree)


def test_export_all_real_patches_git_am(make_tree, cli, tmp_path):
    """With whatever patches patches/ holds now: the series reproduces the tree."""
    tree = make_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    out = tmp_path / "out"
    result = cli("export", tree, "-o", out)
    assert result.exit_code == 0, result.output
    applied = [p.id for p in registry.all_patches() if p.id in _applied(tree)]
    written = sorted(out.glob("*.patch"))
    assert [re.sub(r"^\d{4}-|\.patch$", "", p.name) for p in written] == applied[: len(written)]
    repo = pristine_repo(tmp_path)
    git(repo, "am", *map(str, written))
    assert snapshot(repo / "python" / "sglang") == snapshot(tree)
    assert len(git(repo, "log", "--format=%s").splitlines()) == len(written) + 1


def test_stdout_mbox_and_rerun_removes_stale(make_tree, cli, tmp_path, two_patches):
    tree = make_tree(PRIMARY)
    cli("apply", tree)
    out = tmp_path / "out"
    assert cli("export", tree, "--out", out).exit_code == 0
    assert len(list(out.glob("*.patch"))) == 2
    # Only the hook applied now: a second export into the same folder leaves no stale 0002.
    assert cli("revert", tree, "test-second").exit_code == 0
    result = cli("export", tree, "--out", out)
    assert result.exit_code == 0
    assert [p.name for p in out.glob("*.patch")] == [f"0001-{HOOK}.patch"]
    assert "skipped test-second" in result.output

    mbox = tmp_path / "all.mbox"
    result = cli("-q", "export", tree, "--stdout")
    assert result.exit_code == 0
    mbox.write_text(result.output)
    repo = pristine_repo(tmp_path)
    git(repo, "am", str(mbox))
    assert snapshot(repo / "python" / "sglang") == snapshot(tree)


def test_native_tree_exports_nothing(make_tree, cli, tmp_path, two_patches):
    tree = make_tree(NATIVE)
    out = tmp_path / "out"
    result = cli("export", tree, "--out", out)
    assert result.exit_code == 0
    assert f"skipped {HOOK}: native upstream" in result.output
    assert "nothing to export" in result.output
    assert not out.exists()  # nothing written: not even the folder
    assert not any(line.endswith(".patch") for line in result.output.splitlines())


def test_export_needs_one_destination(make_tree, cli):
    tree = make_tree(PRIMARY)
    result = cli("export", tree)
    assert result.exit_code == 2 and "--out" in result.output


def _applied(tree: Path) -> set[str]:
    import json

    return set(json.loads((tree / ".patchkit" / "state.json").read_text())["applied"])


def test_warm_export_transforms_nothing_and_prints_the_same(make_tree, cli, tmp_path, monkeypatch):
    """export's transforms go through the transform cache and the parallel
    preparation apply uses: a second export computes nothing, and every path
    (serial, cold, warm) prints the same bytes."""
    from patchkit.api.exporting import build_series
    from patchkit.engine import locked_session
    from patchkit.transform import parallel
    from patchkit.transform.transformer import Transformer

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1780000000")
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, "trtllm-mha-draft-extend-v2").exit_code == 0  # and the hook it requires: one file twice
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "export-cache"))
    with monkeypatch.context() as serial:  # the serial path alone: what export printed before the cache
        serial.setattr(parallel, "prepare_all", lambda jobs, cache, progress=None: [None] * len(jobs))
        reference = cli("export", tree, "--stdout").stdout
    assert "Subject: [PATCH 2/2]" in reference

    told: list[tuple] = []
    with locked_session(tree, lambda _: None) as session:
        cold = build_series(session, progress=lambda *done: told.append(done)).mbox()
    # The hook's one file, then the second patch's three (one the hook's again).
    assert told[0] == (0, 4) and told[-1] == (4, 4)
    assert cold == reference

    def no_transform(*args, **kwargs):
        raise AssertionError("a warm export transformed a file")

    monkeypatch.setattr(parallel, "compute", no_transform)
    monkeypatch.setattr(Transformer, "run", no_transform)
    told.clear()
    with locked_session(tree, lambda _: None) as session:
        assert build_series(session, progress=lambda *done: told.append(done)).mbox() == reference
    assert told == []  # nothing computed: no progress bar
    assert cli("export", tree, "--stdout").stdout == reference
