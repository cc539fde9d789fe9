"""The suite's folders by kind (tests/README.md): no test file flat in tests/,
none in tests/unit that reads a release or is slow, and the quick loop that
README.md and the pre-commit hook name is the unit and codemods folders."""

from __future__ import annotations

import re
from pathlib import Path

from support import TREE_CALLS

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
QUICK_LOOP = "pytest -q -n 2 tests/unit tests/codemods"


def test_no_test_file_sits_flat_in_tests():
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert flat == [], f"move these into tests/unit, codemods, trees, behaviour, gpu or slow (tests/README.md): {flat}"


def test_unit_and_codemod_tests_read_no_release_and_are_not_slow():
    wrong = {}
    for path in sorted([*(TESTS / "unit").glob("test_*.py"), *(TESTS / "codemods").glob("test_*.py")]):
        text = path.read_text(encoding="utf-8")
        found = [call for call in TREE_CALLS if call in text] + re.findall(r"mark\.(?:slow|behaviour|trees)\b", text)
        if found:
            wrong[path.name] = found
    assert wrong == {}, f"these belong in tests/trees (or tests/slow), not the quick loop: {wrong}"


def test_the_readme_and_the_pre_push_hook_name_the_unit_and_codemods_folders_as_the_quick_loop():
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"Quick loop (offline, under a minute): `.venv/bin/python -m {QUICK_LOOP}`" in readme
    assert f"entry: python -m {QUICK_LOOP}\n" in (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert (TESTS / "README.md").exists()
