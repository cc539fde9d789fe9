"""draft-extend-graph-no-topk: the DRAFT_EXTEND_V2 draft-extend graph computes
no softmax / top-k and replay copies none (V1 keeps both); each form the
runner takes (0.5.10 .. 0.5.12.post1, 0.5.13's argmax fast path, 0.5.14's
V2-only runner, upstream's top-k-free one), the edit shared with
trtllm-mha-draft-extend-v2, refusals, then every targeted release."""

from __future__ import annotations

import pytest
from support import snapshot

PATCH = "draft-extend-graph-no-topk"
RUNNER_FILE = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
#: Every release the patch targets (0.5.17 removed it upstream, sglang #31430).
TARGETS = ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.15", "0.5.16"]
UPSTREAM = ["0.5.17", "0.5.23"]


# --- real trees ------------------------------------------------------------------------


@pytest.mark.trees
@pytest.mark.parametrize("version", TARGETS)
def test_every_targeted_release_applies_verifies_and_reverts_exactly(linked_tree, cli, version):
    package = linked_tree(version)
    before = snapshot(package)
    assert "absent" in cli("status", package, PATCH).output
    result = cli("apply", package, PATCH)
    assert result.exit_code == 0, result.output
    text = (package / RUNNER_FILE).read_text()
    assert text.count("if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:") == (
        1 if version >= "0.5.14" else 2
    )  # 0.5.14+: execute copies none
    compile(text, RUNNER_FILE, "exec")
    assert cli("verify", package, PATCH).exit_code == 0
    assert cli("apply", package, PATCH).exit_code == 0 and (package / RUNNER_FILE).read_text() == text
    assert cli("revert", package, PATCH).exit_code == 0
    assert snapshot(package) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", UPSTREAM)
def test_upstream_has_it_natively(linked_tree, cli, version):
    package = linked_tree(version)
    before = snapshot(package)
    assert "native" in cli("status", package, PATCH).output
    assert cli("apply", package, PATCH).exit_code == 0
    assert snapshot(package) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_with_trtllm_mha_draft_extend_v2_in_either_order_and_revert_of_one_keeps_the_replay_guard(
    linked_tree, cli, version
):
    package = linked_tree(version)
    before = snapshot(package)
    assert cli("apply", package, "trtllm-mha-draft-extend-v2").exit_code == 0
    replay_only = (package / RUNNER_FILE).read_text()
    assert cli("apply", package, PATCH).exit_code == 0
    both = (package / RUNNER_FILE).read_text()
    assert both.count("if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:") == 2
    assert cli("verify", package, PATCH, "trtllm-mha-draft-extend-v2").exit_code == 0
    assert cli("revert", package, "trtllm-mha-draft-extend-v2").exit_code == 0
    assert (package / RUNNER_FILE).read_text() == both  # this patch keeps the replay guard
    assert cli("revert", package).exit_code == 0  # and trtllm-mha-overlap-hook, pulled in by the other
    assert snapshot(package) == before

    other = linked_tree(version)
    assert cli("apply", other, PATCH).exit_code == 0
    assert cli("apply", other, "trtllm-mha-draft-extend-v2").exit_code == 0
    assert (other / RUNNER_FILE).read_text() == both
    assert cli("revert", other, PATCH).exit_code == 0
    assert (other / RUNNER_FILE).read_text() == replay_only
