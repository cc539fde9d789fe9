"""Snippet tests of tests/trees/test_transform_cache.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from patchkit import cache_secret
from patchkit.audit import facts
from patchkit.findings import Finding
from patchkit.transform import cache as transform_cache


def entries(folder: Path) -> list[Path]:
    """The transform entries (not the audit's facts beside them: the test below)."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and p.name != "secret"
        and "audit" not in p.relative_to(folder).parts
    )


def test_a_flipped_finding_in_an_entry_header_is_a_miss(tmp_path):
    # The payload intact, one finding changed: the checksum covers the header too.
    cache = transform_cache.TransformCache(tmp_path)
    done = {"m.Codemod": Finding.done("f")}
    cache.put("k" * 64, transform_cache.Entry({"m.Codemod": Finding.todo("f")}, [["m.Codemod"]], b"x = 1\n", done))
    assert cache.get("k" * 64).after == done
    (path,) = entries(tmp_path)
    header, _, payload = path.read_bytes().partition(b"\n")
    path.write_bytes(header.replace(b'"todo"', b'"done"') + b"\n" + payload)
    assert cache.get("k" * 64) is None


def test_edited_codemods_change_the_key(tmp_path, monkeypatch):
    """A fingerprint, not only the version: a development checkout with edited
    codemods never reads the entries of the code before the edit."""
    transform_cache.fingerprint.cache_clear()
    before = transform_cache.TransformCache.key("0" * 64, [["a.B"]])
    real = Path.read_bytes

    def edited(path):
        data = real(path)
        return data + b"\n# edited\n" if path.name == "needs_cpu_seq_lens_guards.py" else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    transform_cache.fingerprint.cache_clear()
    try:
        assert transform_cache.TransformCache.key("0" * 64, [["a.B"]]) != before
    finally:
        monkeypatch.undo()
        transform_cache.fingerprint.cache_clear()


def test_a_damaged_audit_facts_file_is_computed_again_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path))
    monkeypatch.setattr(facts, "_MEMO", {})
    source = b"class B:\n    def f(self, batch):\n        return batch.seq_lens_cpu.max()\n"
    good = facts.facts_of("srt/m.py", source)
    (path,) = tmp_path.rglob("*.json")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    monkeypatch.setattr(facts, "_MEMO", {})  # a new process
    assert facts.facts_of("srt/m.py", source) == good
    assert json.loads(path.read_text())["facts"]["reads"]  # written whole again


def test_a_secret_others_may_read_or_own_is_not_believed(tmp_path):
    """The cache's secret is the user's own, 0600; one readable by others, or
    another user's, makes the cache unused (a miss, nothing written)."""
    done = {"m.Codemod": Finding.done("f")}
    entry = transform_cache.Entry({"m.Codemod": Finding.todo("f")}, [["m.Codemod"]], b"x = 1\n", done)
    for damage_secret in (lambda p: p.chmod(0o640), lambda p: os.chown(p, 65534, -1) if os.geteuid() == 0 else None):
        folder = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
        transform_cache.TransformCache(folder).put("k" * 64, entry)
        assert (folder / "secret").stat().st_mode & 0o777 == 0o600
        damage_secret(folder / "secret")
        cache_secret._secret.cache_clear()
        assert transform_cache.TransformCache(folder).get("k" * 64) is None
        transform_cache.TransformCache(folder).put("j" * 64, entry)
        assert not list(folder.glob("jj/*"))
