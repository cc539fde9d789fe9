"""Snippet tests of tests/trees/test_vendor_check_default.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit import known_releases


def test_shipped_hashes_cover_every_patch_target():
    import json

    from patchkit import registry

    files = {t.file for p in registry.all_patches() for t in p.targets}
    shipped = set(json.loads(known_releases.PATH.read_text())["files"])
    assert files <= shipped, f"{sorted(files - shipped)}: run `PYTHONPATH=. python scripts/release_hashes.py`"


def test_base_release_of_a_version_string():
    from patchkit.tree import base_release

    assert base_release("0.5.11") == "0.5.11" and base_release("0.5.12.post1") == "0.5.12.post1"
    assert base_release("0.5.11+acme") == "0.5.11"
    assert base_release("0.5.12.post1+cu124.acme-2") == "0.5.12.post1"
    for none in ("unknown", "acme-main", "", "0.5.11+", "v0.5.11"):
        assert base_release(none) is None
