"""The docs name patchkit's version as `patchkit --version` says it: a
transcript line or a mention of patchkit X.Y.Z shows the current version, and
no doc speaks of a later one as the past ("Before 0.3, ...")."""

from __future__ import annotations

import re
from pathlib import Path

from patchkit import __version__

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
# patchkit 0.2.0 / patchkit, version 0.2.0 / sglang-patchkit==0.2.0 / sglang_patchkit-0.2.0-py3...
NAMED = re.compile(
    r"(?<![\w-])(?:sglang[-_])?patchkit(?:[-_]runtime)?(?:,? version |==|-| v?)(\d+\.\d+(?:\.\d+)?)\b", re.I
)
# "Before 0.3," / "since 0.2" / "until 0.4": patchkit's own range (sglang's releases are 0.5.x)
SINCE = re.compile(r"\b(?:before|since|until|as of|from|after) (0\.[0-4](?:\.\d+)?)\b", re.I)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_docs_name_the_current_version():
    current = _key(__version__)
    wrong = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in NAMED.finditer(line):
                if not __version__.startswith(match.group(1)):
                    wrong.append(
                        f"{doc.relative_to(ROOT)}:{number}: {match.group(0)!r} (patchkit --version: {__version__})"
                    )
            for match in SINCE.finditer(line):
                if _key(match.group(1)) > current:
                    wrong.append(
                        f"{doc.relative_to(ROOT)}:{number}: {match.group(0)!r} names a later version than "
                        f"{__version__} as the past"
                    )
    assert not wrong, "\n".join(wrong)


def test_the_patterns_catch_what_they_are_for():
    assert [
        m.group(1) for m in NAMED.finditer("patched by patchkit 0.2.0; sglang-patchkit==0.3.1, patchkit, version 1.0")
    ] == ["0.2.0", "0.3.1", "1.0"]
    assert not NAMED.search("sglang 0.5.12.post1 and sglang-kernel 0.4.2")
    assert [m.group(1) for m in SINCE.finditer("Before 0.3, ... since 0.5.13")] == ["0.3"]


def test_readme_states_the_recorded_test_time():
    """The README's "runs about N minutes" is the last recorded run's time
    (docs/results/test-suite.json), within a quarter of it."""
    import json

    recorded = json.loads((ROOT / "docs" / "results" / "test-suite.json").read_text(encoding="utf-8"))["minutes"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    stated = re.search(r"Set up and run the tests \(.*?runs about (\d+) minutes\)", readme)
    assert stated, "README: the test command's paragraph says how long it runs"
    assert abs(int(stated.group(1)) - recorded) <= recorded / 4, (stated.group(0), recorded)


def test_docs_index_links_every_guide():
    """docs/README.md links every page under docs/ (results aside: their pages link them)."""
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {
        str(p.relative_to(ROOT / "docs"))
        for p in (ROOT / "docs").rglob("*.md")
        if p.name != "README.md" and "results" not in p.relative_to(ROOT / "docs").parts
    }
    assert pages <= linked, sorted(pages - linked)
    for link in linked:
        assert (ROOT / "docs" / link).exists(), link
