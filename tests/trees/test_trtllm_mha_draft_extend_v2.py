"""trtllm-mha-draft-extend-v2 (sglang #25002): each codemod on snippets,
then the whole patch on the real trees."""

from __future__ import annotations

import json

import pytest
from support import NATIVE, PRE_UPSTREAM, pristine, snapshot

PATCH = "trtllm-mha-draft-extend-v2"
WORKER = "srt/speculative/eagle_worker_v2.py"
MHA = "srt/layers/attention/trtllm_mha_backend.py"
RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
KIT = "test/kits/attention_unittest/runner_modes/speculative_draft_extend_runner.py"
LATER = "0.5.17"  # whitelist as a list, V2-only metadata branches, runner `execute` without top-k


# --- real trees -------------------------------------------------------------------------

pytestmark_trees = pytest.mark.trees


def state_of(cli, tree):
    result = cli("status", tree, PATCH, "--format", "json")  # only this patch's files are parsed
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}[PATCH]


@pytestmark_trees
@pytest.mark.parametrize("version", PRE_UPSTREAM)
def test_real_tree_apply_verify_idempotent_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    status = state_of(cli, tree)
    assert status["state"] == "absent"
    assert any(KIT in note and "not applicable" in note for note in status["notes"])

    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    after = snapshot(tree)
    assert {k for k in before if before[k] != after[k]} == {WORKER, MHA, RUNNER}
    assert not (tree / KIT).exists()
    assert cli("apply", tree, PATCH, "--check").exit_code == 0  # postconditions hold: nothing to do
    status = state_of(cli, tree)
    assert status["state"] == "applied" and status["ok"]

    worker = (tree / WORKER).read_text()
    assert "from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend\n" in worker
    assert (
        worker.index("triton_backend import")
        < worker.index("trtllm_mha_backend import")
        < worker.index("trtllm_mla_backend import")
    )
    assert "or isinstance(self.draft_extend_attn_backend" not in worker
    assert "                TRTLLMMLABackend,\n                TRTLLMHAAttnBackend,\n            ),\n" in worker
    mha = (tree / MHA).read_text()
    assert mha.count("        elif forward_mode.is_draft_extend(include_v2=True):\n") == 2
    assert "forward_mode.is_draft_extend():" not in mha
    assert "fill_draft_extend_v2_cu_seqlens_q(metadata, spec_info, bs)" in mha
    assert "from sglang.srt._patchkit.backends.trtllm_mha import fill_draft_extend_v2_cu_seqlens_q\n" in mha
    v1 = "                else:\n                    metadata.max_seq_len_q = 1\n\n                metadata.cu_seqlens_q[1:].copy_(\n"
    assert v1 + "                    torch.cumsum(" in mha  # V1 kept as it was, one level down, under else
    runner = (tree / RUNNER).read_text()
    assert (
        "            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:\n"
        "                out.topk_p = out_copy.topk_p[:unpadding_bs]\n"
        "                out.topk_index = out_copy.topk_index[:unpadding_bs]\n"
    ) in runner
    for rel in (WORKER, MHA, RUNNER):
        compile((tree / rel).read_bytes(), rel, "exec")

    assert cli("apply", tree, PATCH).exit_code == 0
    assert snapshot(tree) == after

    result = cli("revert", tree)  # ours and the overlap hook it pulled in
    assert result.exit_code == 0, result.output
    assert snapshot(tree) == before
    assert snapshot(tree) == snapshot(pristine(version))
    assert state_of(cli, tree)["state"] == "absent"


@pytestmark_trees
@pytest.mark.parametrize("version", [NATIVE, LATER])
def test_upstream_release_is_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    status = state_of(cli, tree)
    assert status["state"] == "native", status
    assert {c["file"] for c in status["checks"]} == {WORKER, MHA, RUNNER, KIT}  # the kit ships with the change
    assert all(c["state"] == "done" for c in status["checks"])
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    assert snapshot(tree) == before
    assert cli("apply", tree, PATCH, "--check").exit_code == 0


@pytestmark_trees
def test_real_tree_revert_only_this_patch_keeps_the_overlap_hook(linked_tree, cli):
    tree = linked_tree("0.5.12.post1")
    before = snapshot(tree)
    assert cli("apply", tree, PATCH).exit_code == 0
    refused = cli("revert", tree, "trtllm-mha-overlap-hook")
    assert refused.exit_code != 0 and PATCH in refused.output
    assert cli("revert", tree, PATCH).exit_code == 0
    mha = (tree / MHA).read_text()
    assert "def update_verify_buffers_to_fill_after_draft" in mha  # the hook stays
    assert (
        "fill_draft_extend_v2_cu_seqlens_q" not in mha and "include_v2=True):\n            metadata = self" not in mha
    )
    assert snapshot(tree)[WORKER] == before[WORKER] and snapshot(tree)[RUNNER] == before[RUNNER]
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before
