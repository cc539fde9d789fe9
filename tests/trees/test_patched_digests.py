"""The same bytes on every release patchkit knows: an apply of every built-in
patch writes files whose sha256 are those recorded in
tests/patched_digests.json (``scripts/patched_digests.py`` rewrites it, for a
change meant to alter what patchkit writes). The safety net of refactors that
must change no written byte (issue 56)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import libcst as cst
import pytest

from patchkit import registry, transform
from patchkit.fetch import fetch_tree
from patchkit.transform import partial

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("patched_digests", ROOT / "scripts" / "patched_digests.py")
assert _spec is not None and _spec.loader is not None
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)

RECORDED = json.loads(script.DIGESTS.read_text())

pytestmark = [pytest.mark.trees, pytest.mark.slow]


def test_every_known_release_is_recorded():
    assert sorted(RECORDED) == sorted(script.releases())


@pytest.mark.parametrize("version", script.releases())
def test_apply_writes_the_recorded_bytes(version):
    """The engine of this run (each known release's files parsed in part,
    the transform cache, the workers) writes the bytes recorded from the plain
    engine's whole parses (``scripts/patched_digests.py``): on every release,
    the proof of the bytes of each codemod's declaration of what it reads
    (tests/trees/test_transform_partial.py)."""
    """The engine of this run (each known release's files parsed in part,
    the transform cache, the workers) writes the bytes recorded from the plain
    engine's whole parses (``scripts/patched_digests.py``): the proof, on every
    release, of each codemod's declaration of what it reads. And each target
    file's partial parse gives its bytes back (merged from
    test_transform_partial.py's per-release sweep, which also transformed
    every such file parsed whole: the recorded digests are that now)."""
    # fetch_tree( : a real release (tests/conftest.py marks it `trees`)
    assert script.written_digests(version) == RECORDED[version]
    assert _parsed_in_part(version) >= 5  # scheduler.py, schedule_batch.py, the metrics mixin, ...


#: (file, sha256 of its bytes, codemods) -> parsed in part: releases share many files byte for byte.
_IN_PART: dict[tuple, bool] = {}


def _parsed_in_part(version: str) -> int:
    """How many of the release's target files parse in part; each one's parse gives its bytes back."""
    root = fetch_tree(version)
    files: dict[str, list] = {}
    for patch in registry.all_patches():
        for target in patch.targets:
            if (root / target.file).is_file():
                files.setdefault(target.file, []).extend(registry.load_codemod(r) for r in target.refs)
    count = 0
    for rel, codemods in files.items():
        source = (root / rel).read_bytes()
        key = (rel, hashlib.sha256(source).hexdigest(), tuple(registry.codemod_name(c) for c in codemods))
        if key not in _IN_PART:
            module = transform.parse_for(rel, source, root / rel, codemods)
            assert module.bytes == source, (version, rel)
            _IN_PART[key] = any(type(s) is partial.Verbatim for s in module.body) or any(
                type(s) is cst.ClassDef
                and isinstance(s.body, cst.IndentedBlock)
                and any(type(i) is partial.Verbatim for i in s.body.body)
                for s in module.body
            )
        count += _IN_PART[key]
    return count
