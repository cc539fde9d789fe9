"""trtllm-mla-overlap-hook: TRTLLMMLABackend's no-op
update_verify_buffers_to_fill_after_draft (upstream from sglang 0.5.19)."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot

PATCH = "trtllm-mla-overlap-hook"
FILE = "srt/layers/attention/trtllm_mla_backend.py"


@pytest.mark.trees
@pytest.mark.parametrize("version, state", [("0.5.12.post1", "absent"), ("0.5.18", "absent"), ("0.5.19", "native")])
def test_real_trees(linked_tree, cli, version, state):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    if state == "native":
        return
    assert cli("apply", tree, PATCH).exit_code == 0
    text = (tree / FILE).read_text()
    assert text.count("def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):") == 1
    compile(text, FILE, "exec")
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
def test_with_trtllm_mla_spec_v2_it_follows_the_buffers_hook(linked_tree, cli):
    tree = linked_tree("0.5.12.post1")
    assert cli("apply", tree, "trtllm-mla-spec-v2", PATCH).exit_code == 0
    text = (tree / FILE).read_text()
    assert (
        text.index("def get_verify_buffers_to_fill_after_draft(self):")
        < text.index("def update_verify_buffers_to_fill_after_draft(")
        < text.index("def init_forward_metadata_capture_cuda_graph(")
    )
