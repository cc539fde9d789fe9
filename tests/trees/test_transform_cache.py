"""The shared transform cache and the parallel preparation of an apply: a warm
apply (every target file seen before) gives the same bytes as a cold one and as
the plain serial engine, without parsing anything; a corrupted, truncated or
foreign cache entry, or two applies writing the cache at once, never give a
wrong tree."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from drift import drift
from support import PRE_UPSTREAM, PRIMARY, linked_copy, pristine, recorded_patched, snapshot
from test_transform_cache_snippets import entries

from patchkit import registry, transform
from patchkit.api.applying import apply_patches
from patchkit.api.reverting import revert_patches
from patchkit.engine import locked_session
from patchkit.transform import cache as transform_cache

pytestmark = pytest.mark.trees

ROOT = Path(__file__).resolve().parents[2]


def apply(tree: Path) -> None:
    with locked_session(tree, lambda _: None, "apply") as session:
        outcome = apply_patches(session, list(registry.all_patches()))
    assert outcome.changed


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def reference():
    """The plain engine's result (no cache, one process, every file parsed
    whole), as tests/patched_digests.json records it."""
    return recorded_patched


def linked(version: str, folder: Path) -> Path:
    """A release's package in ``folder``, hard-linked to the cache: only patchkit writes these trees."""
    return linked_copy(pristine(version), folder / "sglang")


def no_parsing(monkeypatch) -> None:
    def refuse(source, path):
        raise AssertionError(f"warm apply parsed {path}")

    monkeypatch.setattr(transform, "parse", refuse)


# The oldest and the primary release: the two shapes of the tree. Every
# release's cold apply is checked by each patch's own release tests.
@pytest.mark.parametrize("version", [PRE_UPSTREAM[0], PRIMARY])
def test_cold_and_warm_apply_are_byte_identical(version, tmp_path, cache_dir, reference, monkeypatch):
    cold = linked(version, tmp_path / "cold")
    apply(cold)
    assert entries(cache_dir)
    warm = linked(version, tmp_path / "warm")
    with monkeypatch.context() as patch:
        no_parsing(patch)
        apply(warm)
    assert snapshot(cold) == snapshot(warm) == reference(version)
    # The applied trees verify and revert exactly.
    with locked_session(warm, lambda _: None, "apply") as session:
        assert all(r.ok for r in session.reports())
        revert_patches(session, [])
    assert snapshot(warm) == snapshot(pristine(version))


def test_apply_after_revert_parses_nothing(tmp_path, cache_dir, monkeypatch):
    """The tree's own detection cache knows every file by then: a target file
    that a patch to apply leaves as it is (its findings all done) is neither
    prepared nor parsed."""
    tree = linked(PRIMARY, tmp_path / "t")
    apply(tree)
    patched = snapshot(tree)
    with locked_session(tree, lambda _: None, "revert") as session:
        revert_patches(session, [])
    with monkeypatch.context() as patch:
        no_parsing(patch)
        apply(tree)
    assert snapshot(tree) == patched


def test_cold_and_warm_apply_under_drift(tmp_path, cache_dir, monkeypatch):
    """Once, with every drift at once ("everything"): each drift alone is
    applied and verified by tests/trees/test_forks.py; here the question is only
    whether the cache and the workers give the serial engine's bytes."""
    pytest.importorskip("black")
    files = sorted({f for p in registry.all_patches() for f in p.files})
    trees = []
    for label in ("serial", "cold", "warm"):
        tree = linked(PRIMARY, tmp_path / label)  # drift() breaks the links of the files it edits
        drift(tree, files, "everything")
        trees.append(tree)
    serial, cold, warm = trees
    with monkeypatch.context() as patch:
        patch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
        patch.setenv("PATCHKIT_JOBS", "1")
        apply(serial)
    apply(cold)
    with monkeypatch.context() as patch:
        no_parsing(patch)
        apply(warm)
    assert snapshot(cold) == snapshot(warm) == snapshot(serial)


def damage(folder: Path, how: str) -> int:
    count = 0
    for path in entries(folder):
        data = path.read_bytes()
        header, _, payload = data.partition(b"\n")
        if how == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif how == "flip" and payload:
            path.write_bytes(header + b"\n" + payload[:-10] + b"# damaged\n")
        elif how == "garbage":
            path.write_bytes(b"\x00\xff not an entry")
        elif how == "empty":
            path.write_bytes(b"")
        else:
            continue
        count += 1
    return count


def test_damaged_cache_entries_fall_back_to_a_cold_transform(tmp_path, cache_dir, reference, monkeypatch):
    apply(linked(PRIMARY, tmp_path / "first"))  # one cold apply fills the cache each damage starts from
    for how in ("truncate", "flip", "garbage", "empty"):
        damaged = tmp_path / f"cache-{how}"
        shutil.copytree(cache_dir, damaged)
        monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(damaged))
        assert damage(damaged, how), how
        tree = linked(PRIMARY, tmp_path / how)
        apply(tree)
        assert snapshot(tree) == reference(PRIMARY), how
        # ... and the damaged entries were rewritten: the next apply is warm again.
        assert all(transform_cache.TransformCache(damaged).get(p.name) is not None for p in entries(damaged)), how


def forge(folder: Path) -> int:
    """Replace every entry's patched bytes with wrong ones that still pass the
    entry's own checks (length and sha256 recomputed): only the key tells."""
    count = 0
    cache = transform_cache.TransformCache(folder)
    for path in entries(folder):
        entry = cache.get(path.name)
        if entry is not None and entry.new is not None:
            entry.new = b"# forged\n" + entry.new
            cache.put(path.name, entry)
            count += 1
    return count


def test_another_patchkit_versions_cache_is_not_used(tmp_path, cache_dir, reference, monkeypatch):
    monkeypatch.setattr("patchkit.__version__", "0.0.1-other")
    transform_cache.fingerprint.cache_clear()
    apply(linked(PRIMARY, tmp_path / "other"))
    assert forge(cache_dir)
    # That version would trust its (forged) entries: the key is what protects.
    fooled = linked(PRIMARY, tmp_path / "fooled")
    apply(fooled)
    assert snapshot(fooled) != reference(PRIMARY)

    monkeypatch.undo()
    transform_cache.fingerprint.cache_clear()
    tree = linked(PRIMARY, tmp_path / "ours")
    apply(tree)
    assert snapshot(tree) == reference(PRIMARY)


def test_two_concurrent_applies_share_the_cache(tmp_path, cache_dir, reference):
    trees = [linked(PRIMARY, tmp_path / f"t{i}") for i in range(2)]
    env = {**os.environ, "PATCHKIT_TRANSFORM_CACHE": str(cache_dir)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "patchkit", "-q", "apply", str(t)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for t in trees
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()
    for tree in trees:
        assert snapshot(tree) == reference(PRIMARY)
    assert not [p for p in cache_dir.rglob(".*") if p.is_file()], "temporary files left behind"
    warm = linked(PRIMARY, tmp_path / "warm")
    apply(warm)
    assert snapshot(warm) == reference(PRIMARY)


def test_cache_off_and_read_only_cache(tmp_path, monkeypatch, reference):
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
    tree = linked(PRIMARY, tmp_path / "off")
    apply(tree)
    assert snapshot(tree) == reference(PRIMARY)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(folder))
    try:
        tree = linked(PRIMARY, tmp_path / "ro-tree")
        apply(tree)  # a cache it cannot write only costs speed
        assert snapshot(tree) == reference(PRIMARY)
    finally:
        folder.chmod(0o700)


def test_status_and_verify_on_a_patched_tree_import_neither_libcst_nor_codemods(tmp_path, cache_dir):
    tree = linked(PRIMARY, tmp_path / "t")
    apply(tree)
    code = (
        "import sys; from patchkit.cli import main\n"
        "for args in (['-q', 'status', sys.argv[1]], ['-q', 'verify', sys.argv[1]]):\n"
        "    try:\n        main(args)\n    except SystemExit as exc:\n        assert exc.code == 0, exc.code\n"
        "bad = sorted(m for m in sys.modules if m == 'libcst' or m.startswith('patchkit.codemods.'))\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", "import json\n" + code, str(tree)], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode().strip().splitlines()[-1]) == []


def poison(folder: Path, line: bytes) -> int:
    """The issue's attack: the cached output of eagle_worker_v2.py gets ``line``, and the
    entry's check is fixed up as anyone who can write the cache can (the
    length, and sha256 of the sorted header and the payload)."""
    count = 0
    for path in entries(folder):
        header, _, payload = path.read_bytes().partition(b"\n")
        meta = json.loads(header)
        if not (meta["has_new"] and b"class EAGLEWorkerV2" in payload):
            continue
        payload = line + payload
        check = "seal" if "seal" in meta else "sha256"  # the field's name before issue 68
        meta.pop(check)
        meta["length"] = len(payload)
        meta[check] = hashlib.sha256(json.dumps(meta, sort_keys=True).encode() + b"\n" + payload).hexdigest()
        path.write_bytes(json.dumps(meta, sort_keys=True).encode() + b"\n" + payload)
        count += 1
    return count


def test_a_poisoned_entry_never_reaches_a_tree(tmp_path, cache_dir, reference, cli):
    """Issue 68: an entry whose patched bytes were edited (an ``os.system``
    line) and whose length and sha256 were recomputed was written into the
    next tree, and ``verify`` said OK. Entries are sealed with the cache's
    secret: the poisoned one is a miss, the tree gets the real transform."""
    apply(linked(PRIMARY, tmp_path / "first"))
    line = b"import os; os.system('touch /tmp/pwned')\n"
    assert poison(cache_dir, line) == 1
    tree = linked(PRIMARY, tmp_path / "fresh")
    assert cli("apply", tree).exit_code == 0
    assert snapshot(tree) == reference(PRIMARY)
    assert not any(line in p.read_bytes() for p in tree.rglob("*.py"))
    assert cli("verify", tree).exit_code == 0
