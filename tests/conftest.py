"""Shared fixtures: real sglang trees (downloaded at test time, cached outside
git) and a CLI runner. Plain helpers live in support.py.

Test files live in folders by kind (tests/README.md; tests/unit/test_suite_layout.py
checks it): ``unit/`` and ``codemods/`` (each patch's snippet tests) read no release and
are the quick loop (``pytest -q -n 2 tests/unit tests/codemods``), ``trees/``
reads real releases (a trees test may import its patch's snippet module:
``codemods/`` is on ``sys.path`` too), ``behaviour/`` imports patched
sglang on CPU, ``gpu/`` is everything about the GPU proofs (what needs a GPU
skips without one), ``slow/`` runs heavy tools (mypy). The shared helpers
(support.py, drift.py, profiling.py, sglang_cpu_env.py, dp_settings.py, duel_runs.py) stay
here, on ``sys.path`` for every folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent / "codemods"))

import profiling  # noqa: E402
from support import PRIMARY, TREE_CALLS, TREE_FIXTURES, linked_copy, linked_sources_written  # noqa: E402

from patchkit import settings  # noqa: E402
from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree, fetch_tree  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with profiling.running(item.nodeid):
        yield


def pytest_collection_modifyitems(config, items):
    """The longest files first (by tests/durations.json, written by
    ``scripts/test_profile.py --write-durations``; a file not in it counts as
    long): with ``--dist loadfile --no-loadscope-reorder`` each worker takes
    the longest file left, so both cores stay busy to the end. Tests keep
    their order inside a file."""
    path = Path(__file__).with_name("durations.json")
    seconds = json.loads(path.read_text()) if path.exists() else {}
    unknown = max(seconds.values(), default=0.0)
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: -seconds.get(Path(str(item.path)).relative_to(root).as_posix(), unknown))
    _mark_tree_tests(items)


def _mark_tree_tests(items) -> None:
    """Mark ``trees`` every test that reads a real release (every test of
    tests/trees/ too), so that ``-m "not trees and not behaviour and not slow"``
    runs only what needs no download and no whole-tree transform, as the quick
    loop's folders (tests/unit, tests/codemods) do."""
    trees = Path(__file__).with_name("trees")
    reads: dict[Path, bool] = {}
    for item in items:
        module = Path(str(item.path))
        if module not in reads:
            text = module.read_text(encoding="utf-8") if module.suffix == ".py" else ""
            reads[module] = module.is_relative_to(trees) or any(call in text for call in TREE_CALLS)
        if reads[module] or TREE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.trees)


def pytest_sessionfinish(session):
    profiling.write(os.environ.get("PYTEST_XDIST_WORKER", "main"))


@pytest.fixture(autouse=True, scope="session")
def _transform_cache(tmp_path_factory):
    """The shared transform cache lives in a folder of this test run, never the
    user's ~/.cache (tests/trees/test_transform_cache.py points it elsewhere too). Every
    xdist worker of the run shares it (entries are written whole, then renamed),
    so a (file, patches) transform or a module's audit facts is computed once a run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / "transform-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("transform-cache")
    saved = {name: os.environ.get(name) for name in ("PATCHKIT_TRANSFORM_CACHE", "PATCHKIT_TEST_DRIFT_CACHE")}
    os.environ["PATCHKIT_TRANSFORM_CACHE"] = str(folder)
    # tests/drift.py keeps drifted files in patchkit's cache folder, beside the
    # fetched releases: test input, not patchkit's output, so it may outlive the
    # run (its key holds the drift code and black's version); black over a
    # release's files is seconds a drift.
    os.environ["PATCHKIT_TEST_DRIFT_CACHE"] = str(settings.cache_dir() / "test-drift")
    yield folder
    for name, old in saved.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture
def make_tree(tmp_path):
    """make_tree(version, layout='package') -> path to pass to patchkit, a
    private copy of the real release."""
    counter = iter(range(1000))

    def make(version: str = PRIMARY, layout: str = "package") -> Path:
        with profiling.timed("fetch release"):
            fetch_tree(version)
        with profiling.timed("copy tree"):
            return copy_tree(version, tmp_path / f"t{next(counter)}", layout)

    return make


@pytest.fixture
def linked_tree(tmp_path):
    """linked_tree(version) -> a release's package folder whose files are hard
    links to patchkit's cached copy: for tests in which only patchkit writes
    the tree (see support.linked_copy)."""
    counter = iter(range(1000))
    sources: set[Path] = set()

    def make(version: str = PRIMARY) -> Path:
        with profiling.timed("fetch release"):
            source = fetch_tree(version)
        sources.add(source)
        return linked_copy(source, tmp_path / f"l{next(counter)}" / "sglang")

    yield make
    written = linked_sources_written(sources)
    assert not written, f"a test wrote hard-linked release files in place (fetch them again): {written[:5]}"


@pytest.fixture
def cli():
    """cli(*args) -> click Result; exceptions other than SystemExit propagate."""
    runner = CliRunner()

    def run(*args: str):
        command = next((str(a) for a in args if str(a) in main.commands), "(no command)")
        with profiling.timed(f"cli {command}"):
            return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run
