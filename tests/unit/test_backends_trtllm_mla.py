"""patchkit.backends.trtllm_mla on CPU tensors (the GPU twin is tests/gpu)."""

from __future__ import annotations

import pytest
from support import import_cost

from patchkit.backends import trtllm_mla


def test_module_imports_fast_and_light():
    """Patched sglang imports it: stdlib only at import time (torch lazily)."""
    heavy, seconds = import_cost("patchkit.backends.trtllm_mla")
    assert heavy == [] and seconds < 2.0  # a loaded CI machine: the bound catches a heavy import, not jitter


@pytest.mark.parametrize(
    "num_draft_tokens, skip_prefill, expected",
    [(4, False, True), (1, False, True), (None, False, False), (0, False, False), (4, True, False)],
)
def test_needs_mask_only_for_the_target_of_speculative_decoding(num_draft_tokens, skip_prefill, expected):
    assert trtllm_mla.needs_cuda_graph_custom_mask(num_draft_tokens, skip_prefill) is expected


def test_mask_numel():
    assert trtllm_mla.cuda_graph_custom_mask_numel(16, 256, 4) == 16 * 260


def test_no_mask_is_none_without_importing_torch():
    assert (
        trtllm_mla.alloc_cuda_graph_custom_mask(
            max_num_tokens=8, max_context_len=64, num_draft_tokens=None, skip_prefill=False, device="cpu"
        )
        is None
    )
    assert (
        trtllm_mla.alloc_cuda_graph_custom_mask(
            max_num_tokens=8, max_context_len=64, num_draft_tokens=4, skip_prefill=True, device="cpu"
        )
        is None
    )


def test_verify_buffers_are_mask_and_none():
    sentinel = object()
    buffers = trtllm_mla.verify_buffers_to_fill_after_draft(sentinel)
    assert buffers == [sentinel, None] and buffers[0] is sentinel
    assert trtllm_mla.verify_buffers_to_fill_after_draft(None) == [None, None]


def test_alloc_on_cpu():
    torch = pytest.importorskip("torch")
    mask = trtllm_mla.alloc_cuda_graph_custom_mask(
        max_num_tokens=12, max_context_len=100, num_draft_tokens=4, skip_prefill=False, device=torch.device("cpu")
    )
    assert mask.dtype == torch.bool
    assert mask.shape == (12 * 104,)
    assert mask.device.type == "cpu"
    assert mask.is_contiguous()
    assert not mask.any()
    # Writable in place through the verify buffer list (what build_tree does).
    buffers = trtllm_mla.verify_buffers_to_fill_after_draft(mask)
    buffers[0][:10].fill_(True)
    assert int(mask.sum()) == 10


def test_alloc_accepts_a_device_string():
    torch = pytest.importorskip("torch")
    mask = trtllm_mla.alloc_cuda_graph_custom_mask(
        max_num_tokens=1, max_context_len=1, num_draft_tokens=1, skip_prefill=False, device="cpu"
    )
    assert mask.shape == (2,) and mask.dtype == torch.bool
