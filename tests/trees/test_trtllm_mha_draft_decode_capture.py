"""trtllm-mha-draft-decode-capture (sglang #26521): snippets, then the real
trees (0.5.10 .. 0.5.12.post1 patched; 0.5.13+ native)."""

from __future__ import annotations

import json

import pytest
from support import patch_states, snapshot

from patchkit.codemods import trtllm_mha_draft_decode_capture as cap
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, detect

PATCH = "trtllm-mha-draft-decode-capture"
MHA = "srt/layers/attention/trtllm_mha_backend.py"
SEED = cap.SeedDraftDecodeLengthsAtCapture

BEFORE = """
class TRTLLMHAAttnBackend:
    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        metadata = TRTLLMMHAMetadata()
        if forward_mode.is_decode_or_idle():
            if spec_info is not None:
                metadata.cache_seqlens_int32 = self.decode_cuda_graph_metadata["cache_seqlens"][:bs]
                metadata.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(metadata.cache_seqlens_int32, dim=0), (1, 0))
            else:
                metadata.cache_seqlens_int32 = seq_lens[:bs].to(torch.int32)
"""

AFTER = """
class TRTLLMHAAttnBackend:
    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        metadata = TRTLLMMHAMetadata()
        if forward_mode.is_decode_or_idle():
            if spec_info is not None:
                metadata.cache_seqlens_int32 = self.decode_cuda_graph_metadata["cache_seqlens"][:bs]
                # patchkit trtllm-mha-draft-decode-capture (sglang #26521): the buffer holds
                # zeros until the first replay, and the capture's warm-up runs would attend to
                # an empty KV range (NaN). Seed it as replay does.
                metadata.cache_seqlens_int32.copy_(seq_lens[:bs] + self.speculative_step_id + 1)
                metadata.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(metadata.cache_seqlens_int32, dim=0), (1, 0))
            else:
                metadata.cache_seqlens_int32 = seq_lens[:bs].to(torch.int32)
"""


def test_the_draft_decode_capture_seeds_its_lengths():
    assert_codemod(SEED, BEFORE, AFTER)


def test_a_vendor_seed_of_its_own_is_done():
    vendor = BEFORE.replace(
        "                metadata.cu_seqlens_k",
        "                metadata.cache_seqlens_int32.copy_(seq_lens + 1 + self.speculative_step_id)\n"
        "                metadata.cu_seqlens_k",
    )
    assert detect(SEED, vendor).state is State.DONE


def test_a_fork_named_metadata_otherwise_is_seeded_on_its_own_name():
    out = apply(SEED, BEFORE.replace("metadata.", "md.").replace("metadata =", "md ="))
    assert "md.cache_seqlens_int32.copy_(seq_lens[:bs] + self.speculative_step_id + 1)" in out


def test_no_draft_decode_binding_is_a_missing_anchor():
    moved = BEFORE.replace('self.decode_cuda_graph_metadata["cache_seqlens"][:bs]', "seq_lens[:bs].to(torch.int32)")
    finding = detect(SEED, moved)
    assert finding.state is State.MISSING and "spec_info is not None" in finding.detail


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1"])
def test_release_apply_verify_idempotent_and_exact_revert(make_tree, cli, version):
    tree = make_tree(version)
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
def test_later_releases_are_untouched(make_tree, cli, version, state):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    cli("apply", tree, PATCH)
    assert snapshot(tree) == before
