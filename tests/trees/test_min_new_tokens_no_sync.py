"""min-new-tokens-no-sync (sglang #28397): the min_new_tokens penalty added with
torch.where, not boolean-mask indexing (a host sync every decode step)."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot

PATCH = "min-new-tokens-no-sync"
FILE = "srt/sampling/penaltylib/min_new_tokens.py"


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state", [("0.5.10", "absent"), ("0.5.13", "absent"), ("0.5.14", "native"), ("0.5.23", "native")]
)
def test_real_trees(linked_tree, cli, version, state):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    if state == "native":
        return
    assert cli("apply", tree, PATCH).exit_code == 0
    assert "logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))" in (tree / FILE).read_text()
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


# --- the penalizers' output ids (sglang #28491, #28500) --------------------------------


SCHEDULE = "srt/managers/schedule_batch.py"
SPEC_V2 = "srt/speculative/eagle_info_v2.py"
PINNED = "pin_memory=pin_memory_for("


@pytest.mark.trees
@pytest.mark.parametrize("version, spec_v2", [("0.5.10", False), ("0.5.12.post1", True), ("0.5.13", True)])
def test_real_trees_copy_the_output_ids_without_a_wait(linked_tree, cli, version, spec_v2):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert PINNED not in (tree / SCHEDULE).read_text()
    assert cli("apply", tree, PATCH).exit_code == 0
    assert (tree / SCHEDULE).read_text().count(PINNED) == 1
    assert ((tree / SPEC_V2).read_text().count(PINNED) == 1) is spec_v2
    checks = {c["codemod"].split(".")[1]: c["state"] for c in patch_states(cli, tree, PATCH)[PATCH]["checks"]}
    assert checks["OutputIdsCopyWithoutWait"] == "done"
    assert checks["SpecV2OutputIdsCopyWithoutWait"] == ("done" if spec_v2 else "superseded")
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
