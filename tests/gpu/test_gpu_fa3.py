"""patchkit.backends.mirror_reads and .fa3 on CUDA tensors: the helpers FA3's CUDA-graph replay
calls, inside a captured graph, and the verify tree mask as the static buffer
a graph reads (skips cleanly without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from patchkit.backends import fa3, mirror_reads  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU test: no CUDA device"),
]

DEVICE = "cuda"


def alloc(max_num_tokens=16, max_context_len=256, num_draft_tokens=4, skip_prefill=False, is_draft_runner=False):
    return fa3.alloc_verify_tree_mask(
        max_num_tokens=max_num_tokens,
        max_context_len=max_context_len,
        num_draft_tokens=num_draft_tokens,
        skip_prefill=skip_prefill,
        is_draft_runner=is_draft_runner,
        device=DEVICE,
    )


def test_mask_on_cuda_zeroed_and_contiguous():
    mask = alloc()
    assert mask.device.type == "cuda" and mask.dtype == torch.bool and mask.is_contiguous()
    assert mask.shape == (16 * (256 + 4),)
    assert int(mask.sum()) == 0


@pytest.mark.parametrize("kwargs", [dict(is_draft_runner=True), dict(skip_prefill=True), dict(num_draft_tokens=None)])
def test_no_mask_allocates_nothing(kwargs):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert alloc(**kwargs) is None
    assert torch.cuda.memory_allocated() == before


def test_realistic_mask_size():
    # e.g. 64 requests x 4 draft tokens at 32k context: about 8.4 MB of bool.
    mask = alloc(max_num_tokens=256, max_context_len=32768, num_draft_tokens=4)
    assert mask.numel() * mask.element_size() == 256 * (32768 + 4)


def _no_sync(fn):
    """Run fn with CUDA syncs turned into errors: the sync-free paths must not copy to the host."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_without_the_mirror_nothing_syncs():
    seq_lens = torch.tensor([5, 9], device=DEVICE)
    assert _no_sync(lambda: mirror_reads.host_max_seq_len(None, 4096)) == 4096
    assert _no_sync(lambda: mirror_reads.rows_or_none(None, 2)) is None
    assert _no_sync(lambda: mirror_reads.mirror_or_none(None, torch.zeros(4, dtype=torch.int32))) is None
    table = torch.zeros(2, 256, dtype=torch.int32, device=DEVICE)
    assert _no_sync(lambda: mirror_reads.pages_within(257, table)) == 256
    # The one helper that keeps a local sync without the mirror (the
    # prefill-aware sliding-window ratchet) does sync, by design.
    with pytest.raises(RuntimeError):
        _no_sync(lambda: mirror_reads.rows_max(None, seq_lens, 2))


def test_static_width_page_table_inside_a_captured_graph():
    """The replay pattern FA3 uses without the mirror: gather the whole
    static-width table from req_to_token into a preallocated buffer, captured
    once and replayed for new requests and lengths."""
    ctx, bs = 64, 2
    req_to_token = torch.arange(8 * ctx, dtype=torch.int32, device=DEVICE).reshape(8, ctx)
    pool = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    strided = torch.arange(0, ctx, 1, device=DEVICE)
    table = torch.zeros(bs, ctx, dtype=torch.int32, device=DEVICE)
    pages = mirror_reads.pages_within(
        mirror_reads.host_max_seq_len(None, ctx) + 1, table
    )  # bound + a draft step, capped

    def body():
        table[:, :pages].copy_(req_to_token[pool[:, None], strided[None, :pages]])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    pool.copy_(torch.tensor([3, 6], device=DEVICE))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(table, req_to_token[[3, 6]])


def test_mask_is_a_stable_buffer_for_a_captured_graph():
    """build_tree fills the mask in place between replays; the verify graph
    reads the same storage."""
    mask = alloc(max_num_tokens=8, max_context_len=32, num_draft_tokens=4)
    out = torch.zeros((), dtype=torch.int64, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out.copy_(mask.sum())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(mask.sum())
    buffers = fa3.verify_buffers(mask)
    buffers[0][:10] = True  # what build_tree_kernel_efficient does, in place
    graph.replay()
    torch.cuda.synchronize()
    assert int(out) == 10
