"""Snippet tests of tests/trees/test_trtllm_mha_spec_v2.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

CLASSES = '''
class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    """TRTLLM MHA attention kernel from flashinfer."""

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        seq_lens_cpu = seq_lens_cpu[:bs]
        if forward_mode.is_decode_or_idle():
            max_len = seq_lens_cpu.max().item()
            metadata.max_seq_len_k = max_len + self.speculative_step_id + 1
        elif forward_mode.is_target_verify():
            metadata.max_seq_len_k = (
                seq_lens_cpu.max().item() + self.speculative_num_draft_tokens
            )

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata.max_seq_len_k = forward_batch.seq_lens_cpu.max().item()
        else:
            if any(
                forward_batch.extend_prefix_lens_cpu
            ) or forward_batch.forward_mode.is_draft_extend(include_v2=True):
                max_q = max(forward_batch.extend_seq_lens_cpu)


class TRTLLMHAAttnMultiStepDraftBackend(FlashInferMultiStepDraftBackend):
    """Multi-step TRTLLM MHA attention kernel used by EAGLE."""

    def __init__(self, model_runner, topk, speculative_num_steps):
        super().__init__(model_runner, topk, speculative_num_steps)
'''


def test_flags():
    out = apply(mha.BackendOptsOut, CLASSES)
    out = apply(mha.DraftWrapperOptsOut, out)
    assert out.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert "# Page tables use a static width without the CPU mirror" in out
    compile(out, "x.py", "exec")


def test_eager_and_replay_reads():
    out = apply(mha.EagerMetadataWithoutMirror, CLASSES)
    out = apply(mha.ReplayMetadataWithoutMirror, out)
    assert "seq_lens_cpu.max()" not in out
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)" in out
    assert "max_len = host_max_seq_len(seq_lens_cpu, self.max_context_len)" in out
    assert (
        "metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)"
        in out
    )
    assert "any_host_lens(forward_batch.extend_prefix_lens_cpu)" in out
    assert "max_q = max_host_lens(forward_batch.extend_seq_lens_cpu, self.speculative_num_draft_tokens)" in out


def test_upstream_device_page_table_is_done():
    """0.5.14+: the class builds its page table on the device; the reads are gone."""
    upstream = CLASSES.replace(
        "    def init_forward_metadata(self, forward_batch):",
        "    def _fill_page_table_device(self, metadata, req_pool_indices, cache_seqlens):\n"
        "        build_trtllm_mha_page_table(req_to_token=self.req_to_token)\n\n"
        "    def init_forward_metadata(self, forward_batch):",
    )
    for codemod in (mha.EagerMetadataWithoutMirror, mha.ReplayMetadataWithoutMirror):
        finding = detect(codemod, upstream)
        assert finding.state is State.DONE and "device-side page table" in finding.detail
