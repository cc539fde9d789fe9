"""draft-replay-grouped-copy (sglang #28465): the EAGLE draft and draft-extend
CUDA-graph replays queue their per-field buffer copies and run them grouped."""

from __future__ import annotations

import re

import pytest
from support import patch_states, snapshot

PATCH = "draft-replay-grouped-copy"
DRAFT = "srt/speculative/eagle_draft_cuda_graph_runner.py"
EXTEND = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [
        ("0.5.4.post3", "absent"),
        ("0.5.9", "absent"),
        ("0.5.12.post1", "absent"),
        ("0.5.13", "absent"),
        ("0.5.14", "native"),
        ("0.5.23", "native"),
    ],
)
def test_real_trees(linked_tree, cli, version, state):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    if state == "native":
        return
    assert cli("apply", tree, PATCH).exit_code == 0
    for rel, copies in ((DRAFT, 6), (EXTEND, 7)):
        text = (tree / rel).read_text()
        assert text.count("copy_grouped(field_copies)") == 1, rel
        assert text.count("field_copies.append((") >= copies, rel
        assert re.search(r"hidden_states\[[^]]*\]\.copy_\(", text), rel  # kept a copy_, as upstream keeps it
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
