"""Each patch is described once, in its TOML (issue 56, "docs from one source"): the
README's patch table is `patchkit list --format markdown`, and docs/performance.md's
matrix has a column for every patch `patchkit matrix` runs. These fail when a patch is
added, renamed or re-described without the docs following."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit import registry
from patchkit.cli import main
from patchkit.errors import PatchkitError
from patchkit.listing import list_markdown
from patchkit.registry.definitions import Patch

REPO = Path(__file__).resolve().parents[2]

BEGIN, END = "<!-- patchkit list --format markdown -->\n", "\n<!-- end -->"


def _readme_table() -> str:
    text = (REPO / "README.md").read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)]


def test_the_readme_table_is_patchkit_list_markdown():
    result = CliRunner().invoke(main, ["list", "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert _readme_table() == result.output.rstrip("\n"), (
        "README's patch table drifted from the TOMLs: paste `patchkit list --format markdown` between its markers"
    )


def test_every_builtin_patch_says_what_it_changes_and_where_it_was_proven():
    for patch in registry.load().patches:
        assert patch.summary and patch.proven_on, f"patches/{patch.id}.toml: summary and proven_on"


def test_the_table_takes_its_cells_from_the_definition():
    p = Patch(
        id="x",
        title="the title",
        upstream=("sglang#1", "sglang 0.5.23", "vllm#2"),
        requires=(),
        description="",
        summary="a | b\n  c",
    )
    assert list_markdown([p]).splitlines()[2] == "| `x` | #1 0.5.23 vllm#2 | a \\| b c | - |"
    q = Patch(id="y", title="only a title", upstream=(), requires=(), description="")
    assert list_markdown([q]).splitlines()[2] == "| `y` | - | only a title | - |"


def test_performance_md_has_a_matrix_column_for_every_patch():
    text = (REPO / "docs" / "performance.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| release | `"))
    columns = re.findall(r"`([a-z0-9-]+)`", header)
    assert columns == [p.id for p in registry.load().patches], (
        "docs/performance.md's matrix is not `patchkit matrix`'s for these patches: run `patchkit matrix -j 2`"
    )


def test_a_summary_that_is_not_text_is_refused_in_one_line():
    with pytest.raises(PatchkitError, match=r"^acme/x.toml: summary must be a string$"):
        registry._parse('id = "x"\ntitle = "t"\nsummary = 3\n', "acme/x.toml")
