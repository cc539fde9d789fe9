"""Snippet tests of tests/trees/test_fa3_spec_v2.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods.common.base import State
from patchkit.testing import apply, code, detect

BACKEND_CLASS = '''
class FlashAttentionBackend(AttentionBackend):
    """FlashAttention backend implementation."""

    def __init__(self, model_runner, skip_prefill=False, speculative_step_id=0, topk=0):
        super().__init__()
        self.max_context_len = model_runner.model_config.context_len
        self.skip_prefill = skip_prefill


class FlashAttentionMultiStepBackend:

    def __init__(self, model_runner, topk, speculative_num_steps):
        self.topk = topk
'''


def test_both_flags_added_with_their_reason():
    out = apply(fa3.BackendOptsOut, BACKEND_CLASS)
    out = apply(fa3.DraftWrapperOptsOut, out)
    assert out.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert '"""FlashAttention backend implementation."""\n\n    # Page tables use a static width' in out
    assert "class FlashAttentionMultiStepBackend:\n    # Read by decide_needs_cpu_seq_lens" in out
    assert "# # " not in out
    compile(out, "x.py", "exec")


def test_dflash_only_instance_opt_out_becomes_false():
    """0.5.15 opted out per instance for dflash only; the instance attribute
    would shadow the class-wide opt-out."""
    src = BACKEND_CLASS.replace(
        "        self.skip_prefill = skip_prefill\n",
        "        self.skip_prefill = skip_prefill\n"
        "        self.needs_cpu_seq_lens = not SpeculativeAlgorithm.from_string(\n"
        "            model_runner.server_args.speculative_algorithm\n"
        "        ).is_dflash()\n",
    )
    finding = detect(fa3.BackendOptsOut, src)
    assert finding.state is State.TODO
    out = apply(fa3.BackendOptsOut, src)
    assert "        self.needs_cpu_seq_lens = False\n" in out and "is_dflash" not in out


def test_upstream_flags_are_done_and_a_fork_value_is_refused():
    upstream = BACKEND_CLASS.replace(
        'implementation."""\n', 'implementation."""\n\n    needs_cpu_seq_lens: bool = False\n'
    )
    upstream = upstream.replace(
        "        self.skip_prefill = skip_prefill\n",
        "        self.skip_prefill = skip_prefill\n        self.needs_cpu_seq_lens = False\n",
    )
    assert detect(fa3.BackendOptsOut, upstream).state is State.DONE
    fork = BACKEND_CLASS.replace('implementation."""\n', 'implementation."""\n\n    needs_cpu_seq_lens = True\n')
    finding = detect(fa3.BackendOptsOut, fork)
    assert finding.state is State.MISSING and "refusing" in finding.detail


EAGER = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        metadata = FlashAttentionMetadata()
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata.max_seq_len_k = forward_batch.seq_lens_cpu.max().item() + (
                self.speculative_step_id + 1
            )
        elif forward_batch.forward_mode.is_target_verify():
            metadata.max_seq_len_k = (
                forward_batch.seq_lens_cpu.max().item()
                + self.speculative_num_draft_tokens
            )
        else:
            metadata.max_seq_len_k = forward_batch.seq_lens_cpu.max().item()
            if any(
                forward_batch.extend_prefix_lens_cpu
            ) or forward_batch.forward_mode.is_draft_extend(include_v2=True):
                metadata.max_seq_len_q = max(forward_batch.extend_seq_lens_cpu)
        metadata.page_table = forward_batch.req_to_token_pool.req_to_token[
            forward_batch.req_pool_indices, : metadata.max_seq_len_k
        ]
"""


def test_eager_reads_take_the_bound_without_the_mirror():
    out = apply(fa3.EagerMetadataWithoutMirror, EAGER)
    assert "seq_lens_cpu.max()" not in out
    assert out.count("host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)") == 3
    assert "any_host_lens(forward_batch.extend_prefix_lens_cpu)" in out
    assert "max_host_lens(forward_batch.extend_seq_lens_cpu, self.speculative_num_draft_tokens)" in out
    compile(out, "x.py", "exec")


EAGER_0515 = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        seqlens_in_batch = forward_batch.seq_lens
        seq_lens_cpu = (
            forward_batch.seq_lens_cpu
            if forward_batch.seq_lens_cpu is not None
            else seqlens_in_batch.cpu()
        )
        metadata.max_seq_len_k = seq_lens_cpu.max().item()
        max_pf = int(seq_lens_cpu[:batch_size].max().item())
"""


def test_eager_015_local_d2h_fallback_becomes_the_mirror():
    out = apply(fa3.EagerMetadataWithoutMirror, EAGER_0515)
    assert ".cpu()" not in out
    assert "seq_lens_cpu = (\n            forward_batch.seq_lens_cpu\n        )" in out
    assert "metadata.max_seq_len_k = host_max_seq_len(seq_lens_cpu, self.max_context_len, forward_batch)" in out
    assert "max_pf = int(rows_max(seq_lens_cpu, forward_batch.seq_lens, batch_size))" in out


EAGER_UPSTREAM = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        seq_lens_cpu = forward_batch.seq_lens_cpu
        eager_max_k = (
            seq_lens_cpu.max().item()
            if seq_lens_cpu is not None
            else self.max_context_len
        )
        if forward_batch.forward_mode.is_draft_extend_v2():
            metadata.max_seq_len_q = self.speculative_num_draft_tokens
        elif any(forward_batch.extend_prefix_lens_cpu):
            metadata.max_seq_len_q = max(forward_batch.extend_seq_lens_cpu)
        if seq_lens_cpu is not None:
            max_pf = int(seq_lens_cpu[:batch_size].max().item())
"""


def test_eager_upstream_016_shape_is_done():
    finding = detect(fa3.EagerMetadataWithoutMirror, EAGER_UPSTREAM)
    assert finding.state is State.DONE, finding


REPLAY = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        seq_lens = seq_lens[:bs]
        seq_lens_cpu = seq_lens_cpu[:bs]
        if forward_mode.is_decode_or_idle():
            metadata = self.decode_cuda_graph_metadata[bs]
            max_len = seq_lens_cpu.max().item()
            metadata.max_seq_len_k = max_len + self.speculative_step_id + 1
            max_seq_pages = (metadata.max_seq_len_k + self.page_size - 1) // self.page_size
            normal_decode_set_metadata(
                metadata.cache_seqlens_int32,
                metadata.cu_seqlens_k,
                metadata.page_table,
                self.req_to_token,
                req_pool_indices,
                self.decode_cuda_graph_metadata["strided_indices"],
                max_seq_pages,
                seq_lens,
                self.speculative_step_id + 1,
                self.page_size,
            )
        elif forward_mode.is_target_verify():
            metadata.max_seq_len_k = (
                seq_lens_cpu.max().item() + self.speculative_num_draft_tokens
            )
"""


def test_replay_reads_cope_with_none():
    out = apply(fa3.ReplayMetadataWithoutMirror, REPLAY)
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)" in out
    assert "max_len = host_max_seq_len(seq_lens_cpu, self.max_context_len)" in out
    assert "host_max_seq_len(seq_lens_cpu, self.max_context_len) + self.speculative_num_draft_tokens" in out
    assert "seq_lens_cpu.max()" not in out


def test_replay_page_count_stays_in_the_table():
    out = apply(fa3.ReplayPageTableFits, REPLAY)
    assert "pages_within(max_seq_pages, metadata.page_table)," in out
    upstream = REPLAY.replace("                max_seq_pages,\n", "                self.max_num_pages,\n")
    assert detect(fa3.ReplayPageTableFits, upstream).state is State.DONE


def test_replay_page_writer_later_upstream_shapes_are_done():
    # 0.5.19: no strided indices, the static width moved up one argument.
    src = REPLAY.replace(
        '                self.decode_cuda_graph_metadata["strided_indices"],\n                max_seq_pages,\n',
        "                self.max_num_pages,\n",
    )
    assert detect(fa3.ReplayPageTableFits, src).state is State.DONE
    # 0.5.20+: the call moved to a helper method of the class.
    moved = code(REPLAY).replace("normal_decode_set_metadata(", "self._set_decode_page_metadata(")
    moved += (
        "\n    def _set_decode_page_metadata(self, metadata, req_pool_indices, seq_lens, delta):\n"
        "        normal_decode_set_metadata(metadata.cache_seqlens_int32, metadata.cu_seqlens_k, metadata.page_table,\n"
        "                                   self.req_to_token, req_pool_indices, self.max_num_pages, seq_lens, delta)\n"
    )
    assert detect(fa3.ReplayPageTableFits, moved).state is State.DONE


def test_later_upstream_flag_refinement_is_kept():
    """0.5.21+: opted out, then refined (KV-shard pools keep the mirror)."""
    src = BACKEND_CLASS.replace(
        'implementation."""\n', 'implementation."""\n\n    needs_cpu_seq_lens: bool = False\n'
    ).replace(
        "        self.skip_prefill = skip_prefill\n",
        "        self.skip_prefill = skip_prefill\n        self.needs_cpu_seq_lens = False\n"
        "        self.needs_cpu_seq_lens = self._kv_shard_pool is not None\n",
    )
    assert detect(fa3.BackendOptsOut, src).state is State.DONE


def test_replay_renamed_method_and_015_local_sync():
    src = (
        REPLAY.replace("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")
        .replace(
            "        seq_lens_cpu = seq_lens_cpu[:bs]\n",
            "        seq_lens_cpu = seq_lens_cpu[:bs] if seq_lens_cpu is not None else None\n",
        )
        .replace(
            "            max_len = seq_lens_cpu.max().item()\n",
            "            max_len = seq_lens_cpu.max().item() if seq_lens_cpu is not None else self.max_context_len\n",
        )
        .replace(
            "            metadata.max_seq_len_k = (\n                seq_lens_cpu.max().item() + self.speculative_num_draft_tokens\n            )\n",
            "            metadata.max_seq_len_k = self._host_max_seq_len(seq_lens_cpu, seq_lens)\n",
        )
    )
    out = apply(fa3.ReplayMetadataWithoutMirror, src)
    assert "metadata.max_seq_len_k = host_max_seq_len(seq_lens_cpu, self.max_context_len)\n" in out
    assert "seq_lens_cpu[:bs] if seq_lens_cpu is not None else None" in out  # upstream's guard kept


MASK_CLASS = BACKEND_CLASS.replace(
    "class FlashAttentionMultiStepBackend:",
    """    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.decode_cuda_graph_metadata = {}

    def get_cuda_graph_seq_len_fill_value(self):
        return 1


class FlashAttentionMultiStepBackend:""",
)


def test_tree_mask_parts():
    out = apply(fa3.InitTreeMask, MASK_CLASS)
    assert "        self.cuda_graph_custom_mask = None\n" in out
    assert '        self.is_draft_runner = getattr(model_runner, "is_draft_worker", False)\n' in out
    out = apply(fa3.AllocTreeMask, out)
    assert "self.cuda_graph_custom_mask = alloc_verify_tree_mask(" in out
    assert "is_draft_runner=self.is_draft_runner," in out
    out = apply(fa3.VerifyBuffersReturnTreeMask, out)
    fill = out.index("def get_cuda_graph_seq_len_fill_value")
    assert out.index("def get_verify_buffers_to_fill_after_draft(self):") > fill
    assert "return verify_buffers(self.cuda_graph_custom_mask)" in out
    compile(out, "x.py", "exec")


def test_tree_mask_superseded_by_the_017_verify_mask():
    src = MASK_CLASS.replace(
        "    def get_cuda_graph_seq_len_fill_value(self):",
        "    @property\n    def verify_mask(self):\n        return self._verify_mask\n\n    def get_cuda_graph_seq_len_fill_value(self):",
    )
    for codemod in (fa3.InitTreeMask, fa3.AllocTreeMask, fa3.VerifyBuffersReturnTreeMask):
        assert detect(codemod, src).state is State.SUPERSEDED


def test_foreign_verify_buffers_override_is_refused():
    src = MASK_CLASS.replace(
        "    def get_cuda_graph_seq_len_fill_value(self):",
        "    def get_verify_buffers_to_fill_after_draft(self):\n        return [self.vendor_mask, None]\n\n    def get_cuda_graph_seq_len_fill_value(self):",
    )
    assert detect(fa3.VerifyBuffersReturnTreeMask, src).state is State.MISSING
