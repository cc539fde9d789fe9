"""The `--format json` documents of apply, revert, status, verify and audit
carry exactly the keys docs/ci.md documents for their schema: none emitted
that the docs lack, none documented that never comes."""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit import registry
from patchkit.cli import main

pytestmark = pytest.mark.trees

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci.md"
HOOK = "trtllm-mha-overlap-hook"


def documented(schema: str) -> set[str]:
    """The key paths of ``schema``'s table in docs/ci.md: the first cell's
    `names`; one without a dot continues the one before it (`tree.path`,
    `package` is tree.package); a trailing [] (a list of values) is dropped."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and f"`{schema}`" in line)
    keys: set[str] = set()
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if not line.startswith("| `"):
            continue
        prefix = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            name = name if "." in name or not prefix else prefix + name
            prefix = name[: name.rfind(".") + 1]
            keys.add(name.removesuffix("[]"))
    # The objects and lists holding a documented key are documented with it.
    return keys | {key[:i].removesuffix("[]") for key in keys for i, c in enumerate(key) if c == "."}


def emitted(doc, documented_keys: set[str], path: str = "", empty: set[str] | None = None) -> tuple[set[str], set[str]]:
    """The key paths of ``doc`` (``a.b``, ``list[].key``), descending into an
    object only where the docs name keys inside it (else it is described as a
    whole); and the lists that were empty (their keys cannot show)."""
    keys, empty = set(), set() if empty is None else empty
    items = doc.items() if isinstance(doc, dict) else ()
    for key, value in items:
        here = f"{path}{key}"
        keys.add(here)
        values = value if isinstance(value, list) else [value]
        inner = f"{here}[]." if isinstance(value, list) else f"{here}."
        if isinstance(value, list) and not value:
            empty.add(inner)
        if any(under(inner, d) for d in documented_keys):
            for item in values:
                keys |= emitted(item, documented_keys, inner, empty)[0]
    return keys, empty


def under(inner: str, name: str) -> bool:
    """Is the documented ``name`` inside ``inner`` (``patches[].checks[].``),
    written in full or from a tail (``checks[].file``)?"""
    return any(name.startswith(inner[i:]) for i in [0] + [j + 1 for j, c in enumerate(inner[:-1]) if c == "."])


def matches(key: str, name: str) -> bool:
    """A documented name is a key path or its tail (`checks[].file` for patches[].checks[].file)."""
    return key == name or key.endswith("." + name)


def run(*args) -> dict:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_documented_keys_are_the_emitted_keys(linked_tree, monkeypatch):
    text = (importlib.resources.files("patchkit.patches") / f"{HOOK}.toml").read_text(encoding="utf-8")
    patches = (registry._parse(text, f"{HOOK}.toml"),)
    monkeypatch.setattr(registry, "all_patches", lambda: patches)
    tree = linked_tree()
    docs = {
        "patchkit.status/1": [run("status", tree, "--format", "json")],
        "patchkit.apply/1": [
            run("apply", tree, "--dry-run", "--format", "json"),
            run("apply", tree, "--format", "json"),
        ],
    }
    docs["patchkit.status/1"] += [run("status", tree, "--format", "json"), run("verify", tree, "--format", "json")]
    docs["patchkit.audit/1"] = [run("audit", tree, "--format", "json")]
    docs["patchkit.revert/1"] = [run("revert", tree, "--format", "json")]
    for schema, samples in docs.items():
        names = documented(schema)
        assert names, schema
        seen, empty = set(), set()
        for doc in samples:
            assert doc["schema"] == schema
            keys, gone = emitted(doc, names)
            seen |= keys
            empty |= gone
        undocumented = sorted(k for k in seen if not any(matches(k, n) for n in names))
        assert not undocumented, f"{schema}: emitted, not in docs/ci.md: {undocumented}"
        never = sorted(n for n in names if not any(matches(k, n) for k in seen) and not any(under(e, n) for e in empty))
        assert not never, f"{schema}: in docs/ci.md, never emitted: {never}"
