"""The same bytes on every release patchkit knows: an apply of every built-in
patch writes files whose sha256 are those recorded in
tests/patched_digests.json (``scripts/patched_digests.py`` rewrites it, for a
change meant to alter what patchkit writes). The safety net of refactors that
must change no written byte (issue 56)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

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
    # fetch_tree( : a real release (tests/conftest.py marks it `trees`)
    assert script.written_digests(version) == RECORDED[version]
