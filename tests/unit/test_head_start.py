"""The transform's workers take on later work (``parallel.HeadStart``): the
side jobs' results reach the parent, ``after`` sees each transformed file,
and a failing head start changes nothing of the transform. The safety rule's
head start computes the same facts as the audit itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit import registry
from patchkit.audit import facts
from patchkit.transform import parallel
from patchkit.transform.cache import Entry, TransformCache


def _fake_compute(rel, job):
    return Entry({}, [["x"]], new=job[1] + b"# changed\n")


def _record_after(rel: str, source: bytes, new: bytes) -> None:
    Path(rel).write_bytes(source + b"->" + new)  # rel: a path under tmp_path (the worker's only way back here)


def _fail() -> object:
    raise RuntimeError("a head start never decides an error")


@pytest.fixture
def two_workers(monkeypatch):
    monkeypatch.setenv("PATCHKIT_JOBS", "2")
    monkeypatch.setattr(parallel, "compute", _fake_compute)  # inherited by the forked workers
    monkeypatch.setattr(registry, "load_codemod", lambda ref: None)  # no codemod runs here


def test_side_jobs_and_after_run_in_the_workers(tmp_path, two_workers):
    jobs = [(str(tmp_path / f"m{i}.py"), (tmp_path / f"m{i}.py", b"x = %d\n" % i, [["ref"]], None)) for i in range(3)]
    taken: list = []
    head = parallel.HeadStart(lambda files: [lambda: 1, lambda: len(files)], taken.append, _record_after)
    entries = parallel.prepare_all(jobs, TransformCache(None), head_start=head)
    assert [e.new for e in entries] == [b"x = %d\n# changed\n" % i for i in range(3)]
    assert sorted(taken) == [1, 3]  # side() was told the three files the workers transform
    assert [(tmp_path / f"m{i}.py").read_bytes() for i in range(3)] == [
        b"x = %d\n->" % i + e.new for i, e in enumerate(entries)
    ]


def test_a_failing_head_start_changes_nothing(tmp_path, two_workers):
    jobs = [(f"m{i}.py", (tmp_path / f"m{i}.py", b"y = %d\n" % i, [["ref"]], None)) for i in range(2)]
    taken: list = []
    head = parallel.HeadStart(lambda files: [_fail, lambda: 3], taken.append, lambda rel, source, new: _fail())
    entries = parallel.prepare_all(jobs, TransformCache(None), head_start=head)
    assert [e.new for e in entries] == [b"y = %d\n# changed\n" % i for i in range(2)]
    assert taken == [3]


def test_facts_computed_elsewhere_are_the_audits_own(monkeypatch):
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
    source = b"class B:\n    def f(self, batch):\n        return batch.seq_lens_cpu.max()\n"
    found = facts.facts_of_many([("srt/m.py", source)])
    monkeypatch.setattr(facts, "_MEMO", {})
    facts.remember(found)
    assert facts.facts_of("srt/m.py", source) is next(iter(found.values()))
    monkeypatch.setattr(facts, "_MEMO", {})
    assert facts.facts_of("srt/m.py", source) == next(iter(found.values()))


def test_the_head_starts_of_several_checks_each_get_their_own_results(tmp_path, two_workers):
    """Two patches' postconditions each ask the workers for work: each
    ``take`` hears its own side jobs' results, each ``after`` every file."""
    from patchkit.postconditions import Postcondition
    from patchkit.transform import checks

    taken: dict[str, list] = {"a": [], "b": []}

    def check_with(name: str, results: list) -> Postcondition:
        class Asks(Postcondition):
            def head_start(self, tree):
                side = lambda files: [lambda result=r: (name, result) for r in results]  # noqa: E731
                return parallel.HeadStart(side, taken[name].append, None)

            def check(self, proposed):
                return None

        return Asks()

    made = [checks.Check("a", check_with("a", [1, 2])), checks.Check("b", check_with("b", [3]))]
    jobs = [(f"m{i}.py", (tmp_path / f"m{i}.py", b"z = %d\n" % i, [["ref"]], None)) for i in range(2)]
    parallel.prepare_all(jobs, TransformCache(None), head_start=checks.head_start(made, None))
    assert sorted(taken["a"]) == [("a", 1), ("a", 2)] and taken["b"] == [("b", 3)]
