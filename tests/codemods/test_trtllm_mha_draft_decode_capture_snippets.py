"""Snippet tests of tests/trees/test_trtllm_mha_draft_decode_capture.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import trtllm_mha_draft_decode_capture as cap
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, detect

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
