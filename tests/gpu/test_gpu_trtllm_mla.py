"""patchkit.backends.trtllm_mla on CUDA tensors, including a captured CUDA graph
(the tree mask is a static buffer the verify graph reads and build_tree fills)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from patchkit.backends import trtllm_mla  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU test: no CUDA device"),
]

DEVICE = "cuda"


def alloc(max_num_tokens=16, max_context_len=256, num_draft_tokens=4, skip_prefill=False, device=DEVICE):
    return trtllm_mla.alloc_cuda_graph_custom_mask(
        max_num_tokens=max_num_tokens,
        max_context_len=max_context_len,
        num_draft_tokens=num_draft_tokens,
        skip_prefill=skip_prefill,
        device=device,
    )


def test_alloc_on_cuda():
    mask = alloc()
    assert mask.device.type == "cuda"
    assert mask.dtype == torch.bool
    assert mask.shape == (16 * (256 + 4),)
    assert mask.is_contiguous()
    assert not bool(mask.any())


def test_alloc_on_a_torch_device_object():
    mask = alloc(device=torch.device("cuda", torch.cuda.current_device()))
    assert mask.device.index == torch.cuda.current_device()


@pytest.mark.parametrize("num_draft_tokens, skip_prefill", [(None, False), (0, False), (4, True)])
def test_no_mask_allocates_nothing(num_draft_tokens, skip_prefill):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert alloc(num_draft_tokens=num_draft_tokens, skip_prefill=skip_prefill) is None
    assert torch.cuda.memory_allocated() == before


def test_realistic_size_fits_and_is_zeroed():
    # e.g. max_bs 64 x 4 draft tokens, 32k context: about 8.4 MB of bool.
    mask = alloc(max_num_tokens=256, max_context_len=32768, num_draft_tokens=4)
    assert mask.numel() == 256 * (32768 + 4)
    assert mask.element_size() == 1
    assert int(mask.sum()) == 0


def test_verify_buffers_inside_a_captured_graph():
    """Allocated before capture (as init_cuda_graph_state does); the graph
    reads the buffer returned by verify_buffers_to_fill_after_draft; filling it
    in place between replays (what build_tree does) changes what the graph sees,
    and the buffer never moves."""
    max_num_tokens, ctx, draft = 8, 32, 4
    mask = alloc(max_num_tokens=max_num_tokens, max_context_len=ctx, num_draft_tokens=draft)
    row = ctx + draft
    out = torch.zeros(max_num_tokens, dtype=torch.int64, device=DEVICE)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside capture
            buf, pos = trtllm_mla.verify_buffers_to_fill_after_draft(mask)
            out.copy_(buf.view(max_num_tokens, row).sum(dim=1))
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        # Inside capture: a pure-Python call, no host sync, no allocation.
        buf, pos = trtllm_mla.verify_buffers_to_fill_after_draft(mask)
        assert pos is None and buf.data_ptr() == mask.data_ptr()
        out.copy_(buf.view(max_num_tokens, row).sum(dim=1))

    mask.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [0] * max_num_tokens

    mask.fill_(True)  # FULL_MASK starts all True
    mask.view(max_num_tokens, row)[1, :5] = False
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [row, row - 5] + [row] * (max_num_tokens - 2)


def test_mask_filled_inside_a_captured_graph():
    """A graph may also write the buffer (a tree-build kernel captured with the
    draft): the writes land in the preallocated mask on every replay."""
    max_num_tokens, ctx, draft = 4, 16, 4
    mask = alloc(max_num_tokens=max_num_tokens, max_context_len=ctx, num_draft_tokens=draft)
    src = torch.zeros(mask.numel(), dtype=torch.bool, device=DEVICE)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        trtllm_mla.verify_buffers_to_fill_after_draft(mask)[0].copy_(src)
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        trtllm_mla.verify_buffers_to_fill_after_draft(mask)[0].copy_(src)

    src[::3] = True
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(mask, src)
    src.fill_(False)
    graph.replay()
    torch.cuda.synchronize()
    assert not bool(mask.any())
