"""Snippet tests of tests/trees/test_verify_tree_mask_fits.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods import verify_tree_mask_fits as fits
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

IMPORT = "from sglang.srt._patchkit.backends.verify_tree_mask import verify_tree_mask_for_batch\n"


WORKER = """
from sglang.srt.speculative.eagle_utils import build_tree_kernel_efficient


class EagleDraftWorker:
    def draft(self, model_worker_batch: ModelWorkerBatch):
        parent_list, top_scores_index, draft_tokens = self.draft_forward(model_worker_batch)
        tree_mask_buf, position_buf = (
            self.target_worker.model_runner.attn_backend.get_verify_buffers_to_fill_after_draft()
        )
        (tree_mask, position, a, b, c, draft_tokens) = build_tree_kernel_efficient(
            model_worker_batch.spec_info.bonus_tokens,
            parent_list,
            top_scores_index,
            draft_tokens,
            model_worker_batch.seq_lens,
            model_worker_batch.seq_lens_sum,
            self.topk,
            self.speculative_num_steps,
            self.speculative_num_draft_tokens,
            self.tree_mask_mode,
            tree_mask_buf,
            position_buf,
        )
        return tree_mask
"""


GUARD = """        # The preallocated mask holds the captured max_bs requests: only a batch it
        # fits gets it (an eager batch above that size would write past its end);
        # for any other, None and the tree-mask build allocates one for the batch.
        tree_mask_buf = verify_tree_mask_for_batch(
            tree_mask_buf,
            self.target_worker.model_runner.attn_backend,
            model_worker_batch.seq_lens,
            self.speculative_num_draft_tokens,
        )
"""


def test_the_worker_keeps_the_mask_only_for_a_batch_it_fits():
    expected = (
        code(WORKER)
        .replace(
            "from sglang.srt.speculative.eagle_utils import build_tree_kernel_efficient\n",
            "from sglang.srt.speculative.eagle_utils import build_tree_kernel_efficient\n" + IMPORT,
        )
        .replace("        )\n        (tree_mask,", "        )\n" + GUARD + "        (tree_mask,")
    )
    assert_codemod(fits.DraftHandsOverAFittingTreeMask, WORKER, expected)


def test_the_trtllm_mla_variant_writes_the_same_and_finds_the_others_edit_done():
    out = apply(fits.DraftHandsOverAFittingTreeMask, WORKER)
    assert apply(fits.DraftHandsOverAFittingTreeMaskUpTo0512, WORKER) == out
    assert_state(fits.DraftHandsOverAFittingTreeMaskUpTo0512, out, State.DONE)


def test_keyword_arguments_of_the_tree_kernel():
    src = WORKER.replace(
        "            model_worker_batch.seq_lens,\n", "            seq_lens=model_worker_batch.seq_lens,\n", 1
    )
    src = src.replace(
        "            self.speculative_num_draft_tokens,\n            self.tree_mask_mode,\n            tree_mask_buf,\n            position_buf,\n",
        "            num_verify_tokens=self.speculative_num_draft_tokens,\n",
    )
    src = src.replace(
        "            model_worker_batch.seq_lens_sum,\n            self.topk,\n            self.speculative_num_steps,\n",
        "",
    )
    out = apply(fits.DraftHandsOverAFittingTreeMask, src)
    assert (
        "            model_worker_batch.seq_lens,\n            self.speculative_num_draft_tokens,\n        )\n" in out
    )


def test_from_0_5_13_trtllm_mla_leaves_the_worker_to_upstream_fa3_does_not():
    src = WORKER.replace("model_worker_batch: ModelWorkerBatch", "batch: ScheduleBatch").replace(
        "model_worker_batch", "batch"
    )
    assert detect(fits.DraftHandsOverAFittingTreeMaskUpTo0512, src).state is State.SUPERSEDED
    assert detect(fits.DraftHandsOverAFittingTreeMask, src).state is State.TODO


def test_moved_tree_mask_build_is_superseded():
    src = code("""
        class EagleDraftWorker:
            def draft(self, batch: ScheduleBatch):
                return build_eagle_verify_input(self, batch)
    """)
    assert detect(fits.DraftHandsOverAFittingTreeMask, src).state is State.SUPERSEDED


def test_a_hook_without_the_tree_kernel_is_missing():
    src = WORKER.replace("build_tree_kernel_efficient(", "vendor_tree(")
    finding = detect(fits.DraftHandsOverAFittingTreeMask, src)
    assert finding.state is State.MISSING and "build_tree_kernel_efficient" in finding.detail


MLA_BACKEND = code("""
    from sglang.srt._patchkit.backends.trtllm_mla import alloc_cuda_graph_custom_mask


    class TRTLLMMLABackend(B):
        def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None):
            self.padded_q_buffer = torch.zeros((max_bs,))

            super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
""")


def test_upstreams_own_unbounded_allocation_is_left_alone():
    """0.5.13 .. 0.5.16 allocate the mask themselves (native there)."""
    src = MLA_BACKEND.replace(
        "        self.padded_q_buffer = torch.zeros((max_bs,))\n",
        "        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * (self.max_context_len + self.num_draft_tokens), dtype=torch.bool)\n",
    )
    assert_state(mla.AllocCustomMask, src, State.DONE)


def test_recording_needs_max_bs():
    src = MLA_BACKEND.replace(
        "max_bs, max_num_tokens, kv_indices_buf=None", "bs_cap, max_num_tokens, kv_indices_buf=None"
    )
    finding = detect(mla.AllocCustomMask, src)
    assert finding.state is State.MISSING and "max_bs" in finding.detail
