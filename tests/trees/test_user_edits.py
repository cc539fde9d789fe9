"""Edits made after apply are never silently lost."""

from __future__ import annotations

import pytest
from support import PRIMARY, pristine_snapshot, snapshot

pytestmark = pytest.mark.trees

MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"
HOOK_LINE = "    def update_verify_buffers_to_fill_after_draft(\n"


def test_unrelated_edit_survives_revert(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, HOOK).exit_code == 0
    text = (tree / MHA).read_text()
    (tree / MHA).write_text(
        text.replace(
            "logger = logging.getLogger(__name__)\n", "logger = logging.getLogger(__name__)\nFORK_SETTING = 3\n"
        )
    )
    result = cli("revert", tree)
    assert result.exit_code == 0, result.output
    assert "kept your edits" in result.output
    reverted = (tree / MHA).read_text()
    assert "FORK_SETTING = 3" in reverted and HOOK_LINE not in reverted
    original = pristine_snapshot(PRIMARY)
    now = snapshot(tree)
    assert {k for k in original if original[k] != now[k]} == {MHA}


def test_edit_overlapping_the_patch_stops_revert(make_tree, cli):
    tree = make_tree(PRIMARY)
    cli("apply", tree, HOOK)
    text = (tree / MHA).read_text()
    edited = text.replace(
        "        pass\n\n    def get_cuda_graph_seq_len_fill_value",
        "        self.fork_counter += 1\n\n    def get_cuda_graph_seq_len_fill_value",
    )
    assert edited != text
    (tree / MHA).write_text(edited)
    before = snapshot(tree)
    result = cli("revert", tree)
    assert result.exit_code == 2
    assert MHA in result.output and "--force" in result.output
    assert snapshot(tree) == before

    forced = cli("revert", tree, "--force")
    assert forced.exit_code == 0
    assert "discarded" in forced.output
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def test_edit_between_two_applies_survives_full_revert(make_tree, cli):
    """apply A, edit the file, apply B on the same file, revert all: edit kept."""
    from patchkit import registry

    same_file = [p.id for p in registry.all_patches() if MHA in p.files and p.id != HOOK]
    if not same_file:
        pytest.skip("needs a second patch on the same file")
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, HOOK).exit_code == 0
    text = (tree / MHA).read_text()
    (tree / MHA).write_text(text + "\nFORK_TAIL = 1\n")
    assert cli("apply", tree).exit_code in (0, 1)
    assert cli("revert", tree).exit_code == 0
    assert (tree / MHA).read_text().endswith("\nFORK_TAIL = 1\n")
