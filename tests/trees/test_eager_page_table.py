"""The eager metadata's page table built on the device (common.page_table's
EagerPageTableToRealLength, on TRT-LLM MHA: sglang #28106's eager half):
snippets, fork drift, the patched code run on CPU, and the upgrade of a tree
patched by the previous form (replay built on the device, eager gathered)."""

from __future__ import annotations

import json

import pytest
from support import snapshot

from patchkit import registry
from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.fetch import fetch_tree
from patchkit.testing import run_all

MHA_FILE = "srt/layers/attention/trtllm_mha_backend.py"
PATCH = "trtllm-mha-spec-v2"
EAGER = mha.EagerPageTableOnDevice


# -- a tree patched by the previous form ------------------------------------------------------------


def _mha_target():
    patch = next(p for p in registry.all_patches() if p.id == PATCH)
    return next(t for t in patch.targets if t.file == MHA_FILE)


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.13"])
def test_the_previous_form_upgrades_to_a_fresh_apply(version):
    src = (fetch_tree(version) / MHA_FILE).read_text()
    codemods = _mha_target().codemods
    assert EAGER in codemods
    fresh, states = run_all(codemods, src)
    assert states == [State.DONE] * len(codemods)
    earlier, _ = run_all([c for c in codemods if c is not EAGER], src)
    assert "fill_page_table_rows(" in earlier and "eager_page_table" not in earlier
    upgraded, _ = run_all(codemods, earlier)
    assert upgraded == fresh != earlier


def _states(cli, tree) -> dict[str, dict]:
    result = cli("status", tree, PATCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}


@pytest.mark.trees
def test_a_tree_applied_by_the_previous_form_is_partial_then_upgrades(linked_tree, cli, monkeypatch):
    """Through the command line: a tree applied by a patchkit whose
    trtllm-mha-spec-v2 lacked the eager build shows the patch partial, and
    apply brings the file to exactly what a fresh apply writes; revert is exact."""
    target = _mha_target()
    pristine_tree, fresh_tree = linked_tree("0.5.12.post1"), linked_tree("0.5.12.post1")
    before = snapshot(pristine_tree)
    assert cli("apply", fresh_tree, PATCH).exit_code == 0
    with monkeypatch.context() as previous:
        previous.setattr(
            target, "refs", tuple(r for r in target.refs if not str(r).endswith(":EagerPageTableOnDevice"))
        )
        previous.setattr(target, "_loaded", None)
        assert cli("apply", pristine_tree, PATCH).exit_code == 0
    text = (pristine_tree / MHA_FILE).read_text()
    assert "fill_page_table_rows(" in text and "eager_page_table" not in text
    assert _states(cli, pristine_tree)[PATCH]["state"] == "partial"
    result = cli("apply", pristine_tree, PATCH)
    assert result.exit_code == 0, result.output
    assert (pristine_tree / MHA_FILE).read_text() == (fresh_tree / MHA_FILE).read_text()
    assert _states(cli, pristine_tree)[PATCH]["state"] == "applied"
    assert cli("revert", pristine_tree).exit_code == 0
    assert snapshot(pristine_tree) == before
