"""``status`` and ``verify`` on a tree patchkit does not manage yet keep no
cache in the tree: their findings go to the shared cache beside the transform
entries (``findings/``), by each file's path and bytes, so the next look at
those bytes, in this tree or another copy of the release, parses nothing; a
damaged entry is a miss, never a wrong finding."""

from __future__ import annotations

import json

import pytest
from support import PRIMARY, snapshot

from patchkit import transform

pytestmark = pytest.mark.trees


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(folder))
    return folder


def states(cli, tree) -> dict:
    result = cli("status", tree, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: (p["state"], p.get("reason")) for p in json.loads(result.stdout)["patches"]}


def refuse_parsing(monkeypatch) -> None:
    def refuse(source, path):
        raise AssertionError(f"parsed {path} again")

    monkeypatch.setattr(transform, "parse", refuse)
    monkeypatch.setattr(transform, "parse_for", lambda rel, source, path, *a, **k: refuse(source, path))


def findings_files(folder):
    return sorted(p for p in (folder / "findings").rglob("*") if p.is_file() and not p.name.startswith("."))


def test_status_of_an_unmanaged_tree_is_detected_once_for_every_copy(linked_tree, cli, cache_dir, monkeypatch):
    first, second = linked_tree(PRIMARY), linked_tree(PRIMARY)
    before = snapshot(first)
    cold = states(cli, first)
    assert findings_files(cache_dir)
    assert not (first / ".patchkit").exists() and snapshot(first) == before  # the tree keeps nothing
    with monkeypatch.context() as patch:
        refuse_parsing(patch)
        assert states(cli, first) == cold
        assert states(cli, second) == cold
    # With the cache off nothing is kept: detected again.
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
    parsed = []
    real = transform.parse
    monkeypatch.setattr(transform, "parse", lambda source, path: parsed.append(path) or real(source, path))
    assert states(cli, linked_tree(PRIMARY)) == cold and parsed


def test_a_damaged_findings_entry_is_detected_again(linked_tree, cli, cache_dir, monkeypatch):
    tree = linked_tree(PRIMARY)
    cold = states(cli, tree)
    assert findings_files(cache_dir)
    for path in findings_files(cache_dir):
        data = json.loads(path.read_text())
        for name, finding in data["findings"].items():
            data["findings"][name] = ["done" if finding[0] != "done" else "todo", *finding[1:]]
        path.write_text(json.dumps(data))
    assert states(cli, tree) == cold
    with monkeypatch.context() as patch:  # and written again whole
        refuse_parsing(patch)
        assert states(cli, tree) == cold
