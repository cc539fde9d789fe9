"""verify-wait-on-stream (sglang #25879): spec v2's wait for the previous verify
moves from the host (``verify_done.synchronize()``) onto the schedule stream."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot

PATCH = "verify-wait-on-stream"
FILE = "srt/managers/schedule_batch.py"


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [
        ("0.5.4.post3", "absent"),
        ("0.5.9", "absent"),
        ("0.5.12.post1", "absent"),
        ("0.5.13", "native"),
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
    text = (tree / FILE).read_text()
    assert "wait_event_on_stream(draft_input.verify_done)" in text and "verify_done.synchronize()" not in text
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
