"""The caches a session keeps in ``.patchkit/cache.json`` and the facts the
shared transform cache keeps beside its transforms: typed keys, one kind of
value each, and whatever another format or a damaged file holds is a miss,
never a wrong value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from patchkit.detection_cache import AuditKey, FindingKey, Learnt, VendorKey
from patchkit.findings import Finding
from patchkit.transform.cache import Entry, TransformCache


def test_the_three_caches_round_trip_through_json():
    learnt = Learnt(
        {
            FindingKey("m.Codemod", "a" * 64): Finding.todo("A.b", "why").at(3),
            FindingKey("m.Other", "b" * 64): Finding.superseded("A.c", "fork", by_tree=True),
        },
        {AuditKey("f" * 64): 2},
        {VendorKey("f" * 64, "t" * 64): 1},
    )
    assert Learnt.from_json(learnt.to_json()) == learnt


def test_a_cache_of_another_shape_is_empty_not_misread():
    # The string-keyed form of format 1 ("codemod|sha256" beside "audit|..." counts).
    assert Learnt.from_json({"m.Codemod|" + "a" * 64: ["todo", "A.b", "", False, 3], "audit|x": 2}) == Learnt()
    assert Learnt.from_json({"audit": [["f" * 64, "two"]]}) == Learnt()
    assert Learnt.from_json([1, 2]) == Learnt()
    # A finding written before findings had lines is detected again where verify would show its line.
    old = {"findings": [["m.C", "a" * 64, ["todo", "A.b", "", False]], ["m.D", "a" * 64, ["done", "A.c", "", False]]]}
    assert Learnt.from_json(old).findings == {FindingKey("m.D", "a" * 64): Finding.done("A.c")}


@dataclass(frozen=True)
class Count:
    KIND: ClassVar[str] = "count"
    n: int

    def to_json(self) -> int:
        return self.n

    @classmethod
    def from_json(cls, data: object) -> "Count":
        if type(data) is not int:
            raise TypeError(data)
        return cls(data)


@dataclass(frozen=True)
class Other(Count):
    KIND: ClassVar[str] = "other"


def test_facts_are_typed_and_apart_from_transforms(tmp_path):
    cache = TransformCache(tmp_path)
    key = cache.fact_key(Count, "x" * 64)
    assert key != cache.fact_key(Other, "x" * 64)
    cache.put_fact(key, Count(3))
    assert cache.get_fact(key, Count) == Count(3)
    assert cache.get_fact(key, Other) is None  # another kind of fact under the key: a miss
    assert cache.get(key) is None  # never read as a transform
    cache.put(key, Entry({"m.C": Finding.done("f")}, []))
    assert cache.get_fact(key, Count) == Count(3)  # nor a transform as a fact
    path = next(p for p in (tmp_path / "audit").rglob("*") if p.is_file())
    path.write_text(path.read_text().replace('"fact": 3', '"fact": 4'))
    assert cache.get_fact(key, Count) is None  # the checksum covers the value
