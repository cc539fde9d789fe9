"""trtllm-mha-draft-decode-capture (sglang #26521): snippets, then the real
trees (0.5.10 .. 0.5.12.post1 patched; 0.5.13+ native)."""

from __future__ import annotations

import json

import pytest
from support import patch_states, snapshot

PATCH = "trtllm-mha-draft-decode-capture"
MHA = "srt/layers/attention/trtllm_mha_backend.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1"])
def test_release_apply_verify_idempotent_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MHA).read_text()
    compile(text, MHA, "exec")
    assert text.count("metadata.cache_seqlens_int32.copy_(seq_lens[:bs] + self.speculative_step_id + 1)") == 1
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
    verify = {p["id"]: p["ok"] for p in json.loads(cli("verify", tree, "--format", "json").output)["patches"]}
    assert verify[PATCH]
    patched = snapshot(tree)
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == patched
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [("0.5.13", "native"), ("0.5.14", "native"), ("0.5.15", "native"), ("0.5.16", "native"), ("0.5.23", "native")],
)
def test_later_releases_are_untouched(linked_tree, cli, version, state):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    cli("apply", tree, PATCH)
    assert snapshot(tree) == before
