"""Where the suite's time goes, per test and per kind of work.

Off unless ``PATCHKIT_TEST_PROFILE`` names a folder. Then each pytest process
(every xdist worker) writes ``<folder>/<worker>.json``: for each test, the
seconds spent in each kind of work the fixtures do (fetching a release,
copying a tree, hashing a tree, each CLI command, importing sglang).
``scripts/test_profile.py`` adds them up with the per-test durations of a
``--junitxml`` file.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

FOLDER = os.environ.get("PATCHKIT_TEST_PROFILE", "")

#: test node id -> kind of work -> seconds (the current test's id is set by conftest).
_spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
_current = {"test": "(collection and session fixtures)"}
#: test node id -> [wall-clock start, end] of its whole protocol (set-up and tear-down included).
_span: dict[str, list[float]] = {}


def set_current(nodeid: str) -> None:
    _current["test"] = nodeid


@contextmanager
def running(nodeid: str):
    """Around one test's whole protocol: whose time the blocks count to, and when it ran."""
    set_current(nodeid)
    started = time.time()
    try:
        yield
    finally:
        _span[nodeid] = [started, time.time()]


@contextmanager
def timed(kind: str):
    """Add the time of the block to ``kind`` for the running test."""
    if not FOLDER:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        _spent[_current["test"]][kind] += time.perf_counter() - started


def write(worker: str) -> None:
    if not FOLDER:
        return
    Path(FOLDER).mkdir(parents=True, exist_ok=True)
    data = {"spent": {test: dict(kinds) for test, kinds in _spent.items()}, "span": _span}
    (Path(FOLDER) / f"{worker}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
