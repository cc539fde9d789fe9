"""Snippet tests of tests/trees/test_trtllm_mla_overlap_hook.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import trtllm_mla_overlap_hook as hook
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code

BACKEND = code("""
    class TRTLLMMLABackend(FlashInferMLAAttnBackend):
        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            pass

        def get_verify_buffers_to_fill_after_draft(self):
            return [None, None]

        def init_forward_metadata(self, forward_batch):
            pass
""")


ADDED = """
    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        # Verify metadata (seq_lens, block tables, cu_seqlens) does not depend on
        # the draft tokens and trtllm-gen reads no tree mask: nothing to redo
        # after the draft (base class: NotImplementedError under the overlap plan stream).
        pass
"""


def test_the_hook_goes_after_the_buffers_it_would_refill():
    out = BACKEND.replace("        return [None, None]\n", "        return [None, None]\n" + ADDED, 1)
    assert_codemod(hook.AddNoopVerifyBuffersHook, BACKEND, out)


def test_without_the_buffers_hook_it_goes_after_init_cuda_graph_state():
    src = BACKEND.replace("    def get_verify_buffers_to_fill_after_draft(self):\n        return [None, None]\n\n", "")
    out = src.replace(
        "        pass\n\n    def init_forward_metadata", "        pass\n" + ADDED + "\n    def init_forward_metadata", 1
    )
    assert_codemod(hook.AddNoopVerifyBuffersHook, src, out)


def test_upstreams_hook_first_in_the_class_is_done():
    """0.5.19+: upstream's, the class's first method."""
    src = BACKEND.replace(
        "class TRTLLMMLABackend(FlashInferMLAAttnBackend):\n",
        "class TRTLLMMLABackend(FlashInferMLAAttnBackend):\n"
        "    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):\n        pass\n\n",
    )
    assert_state(hook.AddNoopVerifyBuffersHook, src, State.DONE)
