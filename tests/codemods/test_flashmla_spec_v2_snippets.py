"""Snippet tests of tests/trees/test_flashmla_spec_v2.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import flashmla_spec_v2 as fm
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

CLASSES = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def __init__(self, model_runner, skip_prefill=False):
        super().__init__(model_runner, skip_prefill)


class FlashMLAMultiStepDraftBackend:
    def __init__(self, model_runner, topk, speculative_num_steps):
        self.topk = topk
"""


def test_both_flags_added_and_a_fork_value_refused():
    out = apply(fm.DraftWrapperOptsOut, apply(fm.BackendOptsOut, CLASSES))
    assert out.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert "class FlashMLABackend(FlashInferMLAAttnBackend):\n    # Block tables use a static width" in out
    fork = CLASSES.replace(
        "):\n    def __init__(self, model_runner, skip",
        "):\n    needs_cpu_seq_lens = True\n\n    def __init__(self, model_runner, skip",
    )
    finding = detect(fm.BackendOptsOut, fork)
    assert finding.state is State.MISSING and "refusing" in finding.detail


EAGER = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def init_forward_metadata(self, forward_batch):
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_decode_or_idle():
            max_seqlen_pad = triton.cdiv(forward_batch.seq_lens_cpu.max().item(), PAGE_SIZE)
            block_kv_indices = torch.full((bs, max_seqlen_pad), -1)
            create_flashmla_kv_indices_triton[(bs,)](self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, None, block_kv_indices, self.req_to_token.stride(0), max_seqlen_pad)
            self.forward_metadata = FlashMLADecodeMetadata(None, None, block_kv_indices)
        elif forward_batch.forward_mode.is_target_verify():
            seq_lens_cpu = forward_batch.seq_lens_cpu + self.num_draft_tokens
            seq_lens = forward_batch.seq_lens + self.num_draft_tokens
            max_seqlen_pad = triton.cdiv(seq_lens_cpu.max().item(), PAGE_SIZE)
            self.forward_metadata = FlashMLADecodeMetadata(None, None, None)
        else:
            super().init_forward_metadata(forward_batch)
"""


def test_eager_block_table_widths_without_the_mirror():
    assert detect(fm.EagerMetadataWithoutMirror, EAGER).state is State.TODO
    out = apply(fm.EagerMetadataWithoutMirror, EAGER)
    assert (
        "triton.cdiv(host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch), PAGE_SIZE)"
        in out
    )
    assert "seq_lens_cpu = plus_or_none(forward_batch.seq_lens_cpu, self.num_draft_tokens)" in out
    assert "host_max_seq_len(seq_lens_cpu, self.max_context_len + self.num_draft_tokens, forward_batch)" in out
    assert ".max().item()" not in out
    assert "from sglang.srt._patchkit.backends.mirror_reads import host_max_seq_len, plus_or_none" in out
    assert detect(fm.EagerMetadataWithoutMirror, out).state is State.DONE


def test_draft_extend_branch_after_verify_launches_like_decode():
    assert detect(fm.EagerDraftExtendMetadata, EAGER).state is State.TODO
    out = apply(fm.EagerDraftExtendMetadata, EAGER)
    verify, extend, parent = (
        out.index(s) for s in ("is_target_verify()", "is_draft_extend_v2()", "super().init_forward_metadata")
    )
    assert verify < extend < parent
    assert "        elif forward_batch.forward_mode.is_draft_extend_v2():\n" in out
    assert "create_flashmla_kv_indices_triton[(bs,)](" in out.split("is_draft_extend_v2")[1]
    assert "draft_extend_seq_lens_k(forward_batch.seq_lens, forward_batch.extend_seq_lens, window)" in out
    assert "self.forward_metadata.seq_lens_k = seq_lens_k" in out
    assert "from sglang.srt._patchkit.backends.flashmla import draft_extend_seq_lens_k" in out
    compile(out, "x.py", "exec")
    assert detect(fm.EagerDraftExtendMetadata, out).state is State.DONE
    # 0.5.13+: the writer's grid has a second dimension; the branch copies it.
    grid = "(bs, get_num_kv_index_blocks_flashmla(max_seqlen_pad, PAGE_SIZE))"
    out = apply(fm.EagerDraftExtendMetadata, EAGER.replace("[(bs,)]", f"[{grid}]"))
    assert f"create_flashmla_kv_indices_triton[{grid}](" in out.split("is_draft_extend_v2")[1]


def test_draft_extend_branch_needs_the_verify_chain():
    src = EAGER.replace(
        "elif forward_batch.forward_mode.is_target_verify()", "elif forward_batch.forward_mode.is_verify()"
    )
    finding = detect(fm.EagerDraftExtendMetadata, src)
    assert finding.state is State.MISSING and "is_target_verify" in finding.detail


REPLAY_OLD = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
        if forward_mode.is_decode_or_idle():
            assert seq_lens_cpu is not None
            seq_lens = seq_lens[:bs]
            seq_lens_cpu = seq_lens_cpu[:bs]
            max_seqlen_pad = triton.cdiv(seq_lens_cpu.max().item(), PAGE_SIZE)
        elif forward_mode.is_target_verify():
            seq_lens = seq_lens[:bs] + self.num_draft_tokens
            seq_lens_cpu = seq_lens_cpu[:bs] + self.num_draft_tokens
            max_seqlen_pad = triton.cdiv(seq_lens_cpu.max().item(), PAGE_SIZE)
"""


REPLAY_0_5_13 = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def _apply_decode_target_verify_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode):
        if True:
            seq_lens = seq_lens[:bs]
            seq_lens_cpu = seq_lens_cpu[:bs] if seq_lens_cpu is not None else None
            if forward_mode.is_target_verify():
                seq_lens = seq_lens + self.num_draft_tokens
                if seq_lens_cpu is not None:
                    seq_lens_cpu = seq_lens_cpu + self.num_draft_tokens
            seq_max = (
                seq_lens_cpu.max().item()
                if seq_lens_cpu is not None
                else seq_lens.max().item()
            )
            max_seqlen_pad = triton.cdiv(seq_max, PAGE_SIZE)
"""


def test_replay_without_the_mirror_0_5_10_shape():
    assert detect(fm.ReplayMetadataWithoutMirror, REPLAY_OLD).state is State.TODO
    out = apply(fm.ReplayMetadataWithoutMirror, REPLAY_OLD)
    assert "assert seq_lens_cpu is None or len(seq_lens_cpu) >= bs" in out
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)\n" in out
    assert "seq_lens_cpu = plus_or_none(rows_or_none(seq_lens_cpu, bs), self.num_draft_tokens)" in out
    assert out.count("triton.cdiv(host_max_seq_len(seq_lens_cpu, self.max_context_len), PAGE_SIZE)") == 2
    assert detect(fm.ReplayMetadataWithoutMirror, out).state is State.DONE


def test_replay_device_max_fallback_becomes_the_static_bound():
    """0.5.13 .. 0.5.15 guarded the mirror but synced on the device lengths
    instead (seq_lens.max().item())."""
    assert detect(fm.ReplayMetadataWithoutMirror, REPLAY_0_5_13).state is State.TODO
    out = apply(fm.ReplayMetadataWithoutMirror, REPLAY_0_5_13)
    assert "seq_lens.max()" not in out and "host_max_seq_len(seq_lens_cpu, self.max_context_len)" in out
    assert "seq_lens_cpu[:bs] if seq_lens_cpu is not None else None" in out  # upstream's own guard kept
    assert detect(fm.ReplayMetadataWithoutMirror, out).state is State.DONE


def test_replay_upstream_shape_is_done():
    upstream = REPLAY_0_5_13.replace(
        """            seq_max = (
                seq_lens_cpu.max().item()
                if seq_lens_cpu is not None
                else seq_lens.max().item()
            )
            max_seqlen_pad = triton.cdiv(seq_max, PAGE_SIZE)
""",
        """            if seq_lens_cpu is not None:
                max_seqlen_pad = triton.cdiv(seq_lens_cpu.max().item(), PAGE_SIZE)
            else:
                max_seqlen_pad = self.cuda_graph_kv_indices.shape[1]
""",
    )
    assert detect(fm.ReplayMetadataWithoutMirror, upstream).state is State.DONE


FORWARD_EXTEND = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.forward_mode in (
            ForwardMode.EXTEND,
            ForwardMode.DRAFT_EXTEND_V2,
        ):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        else:
            o, _ = flash_mla_with_kvcache(
                q=q,
                cache_seqlens=forward_batch.seq_lens.to(torch.int32)
                + self.num_draft_tokens,
            )
            return o
"""


def test_forward_extend_runs_the_draft_extend_on_the_fixed_q_kernel():
    assert detect(fm.ForwardExtendFixedQDraftExtend, FORWARD_EXTEND).state is State.TODO
    out = apply(fm.ForwardExtendFixedQDraftExtend, FORWARD_EXTEND)
    assert "        if forward_batch.forward_mode in (\n            ForwardMode.EXTEND,\n        ):\n" in out
    assert "cache_seqlens=fixed_q_cache_seqlens(forward_batch, self.forward_metadata, self.num_draft_tokens)," in out
    assert "from sglang.srt._patchkit.backends.flashmla import fixed_q_cache_seqlens" in out
    assert detect(fm.ForwardExtendFixedQDraftExtend, out).state is State.DONE


def test_forward_extend_of_0_5_10_keeps_its_mode_test():
    """0.5.10 .. 0.5.12.post1 already send DRAFT_EXTEND_V2 to the fixed-q kernel
    (with the verify lengths): only cache_seqlens changes."""
    src = FORWARD_EXTEND.replace(
        "in (\n            ForwardMode.EXTEND,\n            ForwardMode.DRAFT_EXTEND_V2,\n        ):",
        "== ForwardMode.EXTEND or forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND:",
    )
    out = apply(fm.ForwardExtendFixedQDraftExtend, src)
    assert "== ForwardMode.EXTEND or forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND:" in out
    assert "fixed_q_cache_seqlens(" in out


def test_forward_extend_upstream_k_lengths_are_done():
    upstream = FORWARD_EXTEND.replace("            ForwardMode.DRAFT_EXTEND_V2,\n", "").replace(
        "cache_seqlens=forward_batch.seq_lens.to(torch.int32)\n                + self.num_draft_tokens,",
        "cache_seqlens=self.forward_metadata.seq_lens_k,",
    )
    assert detect(fm.ForwardExtendFixedQDraftExtend, upstream).state is State.DONE
