"""patchkit.backends.page_table on CUDA: the Triton kernel against the torch
reference at real shapes, without a host sync, and inside a captured graph
(skips cleanly without CUDA). A timing beside it, printed with -s: the old
static-width gather against the device build."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from patchkit.backends import page_table as pt  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU test: no CUDA device"),
]

DEVICE = "cuda"


def _batch(bs=48, ctx=131072, page_size=1, short=2000, long=100000):
    req_to_token = torch.randint(0, 1 << 24, (bs + 8, ctx), dtype=torch.int32, device=DEVICE)
    pool = torch.randperm(bs + 8, device=DEVICE)[:bs]
    lens = torch.full((bs,), short, dtype=torch.int32, device=DEVICE)
    lens[::7] = long
    table = torch.full((bs, -(-ctx // page_size)), -1, dtype=torch.int32, device=DEVICE)
    return req_to_token, pool, lens, table


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_kernel_matches_the_reference_without_a_sync(page_size):
    req_to_token, pool, lens, table = _batch(page_size=page_size)
    expected = table.clone()
    pt.fill_page_table_rows_reference(req_to_token, pool, lens, expected, page_size)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert pt.fill_page_table_rows(req_to_token, pool, lens, table, page_size) is True
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(table, expected)


def test_inside_a_captured_graph():
    req_to_token, pool, lens, table = _batch(bs=4, ctx=4096, short=100, long=3000)
    pt.fill_page_table_rows(req_to_token, pool, lens, table, 1)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pt.fill_page_table_rows(req_to_token, pool, lens, table, 1)
    lens.copy_(torch.tensor([4096, 1, 0, 7], device=DEVICE))
    table.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.full_like(table, -1)
    pt.fill_page_table_rows_reference(req_to_token, pool, lens, expected, 1)
    assert torch.equal(table, expected)


@pytest.mark.parametrize("bs", [8, 32, 48])
def test_time_against_the_static_width_gather(bs):
    req_to_token, pool, lens, table = _batch(bs=bs)
    strided = torch.arange(0, table.shape[1], device=DEVICE)

    def gather():
        table[:, : table.shape[1]].copy_(req_to_token[pool[:, None], strided[None, :]])

    def device_build():
        pt.fill_page_table_rows(req_to_token, pool, lens, table, 1)

    def per_call_us(fn, n=200):
        for _ in range(10):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000 / n

    old, new = per_call_us(gather), per_call_us(device_build)
    print(f"bs {bs}, context 131072, lengths 2000 (every 7th 100000): gather {old:.1f} us, device build {new:.1f} us")
    assert new < old
