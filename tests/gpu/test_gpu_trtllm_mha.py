"""patchkit.backends.trtllm_mha on a CUDA device: values, in place, no host
sync (``torch.cuda.set_sync_debug_mode("error")``) and inside a captured CUDA
graph, as the patched TRTLLMHAAttnBackend replay uses it (sglang #25002).

Skipped without torch or a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from patchkit.backends import trtllm_mha as be  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU test: no CUDA device"),
]

MAX_BS = 16


def metadata(capture_stride: int = 1):
    """Preallocated int32 cu_seqlens_q on the GPU (a view of a larger buffer,
    as the backend slices its graph buffers) and the capture's max_seq_len_q."""
    buf = torch.full((MAX_BS + 4,), -1, dtype=torch.int32, device="cuda")
    return NS(cu_seqlens_q=buf[: MAX_BS + 1], max_seq_len_q=capture_stride), buf


def accepted(value: int):
    return torch.full((MAX_BS,), value, dtype=torch.int32, device="cuda")


@contextlib.contextmanager
def no_host_sync():
    """Any synchronizing CUDA call inside raises."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def expected(bs: int, stride: int) -> list[int]:
    return list(range(0, bs * stride + 1, stride))


@pytest.mark.parametrize("bs", [1, 2, 5, 16])
@pytest.mark.parametrize("stride", [1, 3, 4])
def test_values_in_place_without_host_sync(bs, stride):
    md, buf = metadata(capture_stride=99)
    view, ptr = md.cu_seqlens_q, md.cu_seqlens_q.data_ptr()
    spec = NS(num_tokens_per_req=stride, num_accept_tokens=accepted(1), num_accept_tokens_cpu=None)
    with no_host_sync():
        got = be.fill_draft_extend_v2_cu_seqlens_q(md, spec, bs)
    torch.cuda.synchronize()
    assert got == stride and md.max_seq_len_q == stride
    assert md.cu_seqlens_q is view and view.data_ptr() == ptr
    assert view.dtype == torch.int32 and view.device.type == "cuda"
    assert buf[: bs + 1].tolist() == expected(bs, stride)
    assert buf[bs + 1 :].tolist() == [-1] * (len(buf) - bs - 1)


def test_capture_fallback_without_host_sync():
    """num_tokens_per_req unset (capture's synthetic input), accepted counts
    only on the GPU: the capture stride is used, the device is not read."""
    md, buf = metadata(capture_stride=4)
    spec = NS(num_tokens_per_req=-1, num_accept_tokens=accepted(4), num_accept_tokens_cpu=None)
    with no_host_sync():
        assert be.fill_draft_extend_v2_cu_seqlens_q(md, spec, 3) == 4
    torch.cuda.synchronize()
    assert buf[:4].tolist() == [0, 4, 8, 12]


def test_sync_debug_mode_really_catches_the_device_read():
    """Harness check: without any host value the last resort reads the GPU
    tensor (.item()), which the sync debug mode must flag."""
    spec = NS(num_tokens_per_req=-1, num_accept_tokens=accepted(3), num_accept_tokens_cpu=None)
    with no_host_sync(), pytest.raises(RuntimeError):
        be.draft_extend_v2_stride(spec, 3, capture_stride=None)
    assert be.draft_extend_v2_stride(spec, 3, capture_stride=None) == 3  # allowed outside capture


def test_no_allocation_on_the_device():
    md, _ = metadata(capture_stride=2)
    spec = NS(num_tokens_per_req=2, num_accept_tokens=accepted(2), num_accept_tokens_cpu=None)
    be.fill_draft_extend_v2_cu_seqlens_q(md, spec, 8)  # warm up kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    be.fill_draft_extend_v2_cu_seqlens_q(md, spec, 8)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() == before


def allocated_by_capture(fn) -> int:
    """Bytes a fresh CUDA graph holds after capturing ``fn``."""
    graph = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - before


@pytest.mark.parametrize("from_capture_stride", [False, True], ids=["num_tokens_per_req", "capture-fallback"])
def test_inside_a_captured_cuda_graph(from_capture_stride):
    bs, stride = 5, 4
    md, buf = metadata(capture_stride=stride)
    spec = NS(
        num_tokens_per_req=-1 if from_capture_stride else stride,
        num_accept_tokens=accepted(stride),
        num_accept_tokens_cpu=None,
    )
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as sglang does
        be.fill_draft_extend_v2_cu_seqlens_q(md, spec, bs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    # A capture can hold a small block of its own (measured on an H200: 1 KiB
    # for some captures, even of one in-place kernel): compare against that.
    baseline = allocated_by_capture(lambda: md.cu_seqlens_q[:1].zero_())
    graph = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(graph):
        got = be.fill_draft_extend_v2_cu_seqlens_q(md, spec, bs)
    torch.cuda.synchronize()
    assert got == stride
    assert torch.cuda.memory_allocated() - before <= baseline  # the fill allocates nothing

    buf.fill_(-1)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert buf[: bs + 1].tolist() == expected(bs, stride)
    assert buf[bs + 1 :].tolist() == [-1] * (len(buf) - bs - 1)
    graph.reset()
