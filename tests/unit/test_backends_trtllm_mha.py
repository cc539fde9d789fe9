"""patchkit.backends.trtllm_mha on CPU tensors: the DRAFT_EXTEND_V2 replay
metadata that patched TRTLLMHAAttnBackend code calls (sglang #25002)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from patchkit.backends import trtllm_mha as be

torch = pytest.importorskip("torch")

DEVICE = "cpu"


def metadata(max_bs: int = 8, capture_stride: int = 1):
    """A TRTLLMMHAMetadata stand-in as the patched capture leaves it: a
    preallocated int32 cu_seqlens_q (here a view of a larger buffer, as the
    backend slices its graph buffers) and max_seq_len_q = the capture stride."""
    buf = torch.full((max_bs + 4,), -1, dtype=torch.int32, device=DEVICE)
    return NS(cu_seqlens_q=buf[: max_bs + 1], max_seq_len_q=capture_stride), buf


def test_importing_is_light():
    code = "import sys, patchkit.backends.trtllm_mha; print(sorted(m for m in ('torch', 'libcst', 'click') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("bs", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("stride", [1, 2, 4, 5])
def test_cu_seqlens_q_values_from_num_tokens_per_req(bs, stride):
    md, _ = metadata(8, capture_stride=99)
    spec = NS(num_tokens_per_req=stride, num_accept_tokens=torch.ones(8, dtype=torch.int32))
    assert be.fill_draft_extend_v2_cu_seqlens_q(md, spec, bs) == stride
    assert md.max_seq_len_q == stride
    expected = torch.arange(0, bs * stride + 1, stride, dtype=torch.int32)
    assert torch.equal(md.cu_seqlens_q[: bs + 1], expected)
    assert md.cu_seqlens_q.dtype == torch.int32


def test_fills_the_preallocated_buffer_in_place():
    md, buf = metadata(8)
    view = md.cu_seqlens_q
    ptr, storage = view.data_ptr(), view.untyped_storage().data_ptr()
    be.fill_draft_extend_v2_cu_seqlens_q(md, NS(num_tokens_per_req=3), 4)
    assert md.cu_seqlens_q is view
    assert view.data_ptr() == ptr and view.untyped_storage().data_ptr() == storage
    # Written through to the big buffer; nothing past bs + 1 touched.
    assert buf[:5].tolist() == [0, 3, 6, 9, 12]
    assert buf[5:].tolist() == [-1] * (len(buf) - 5)


def test_no_new_tensor_is_allocated(monkeypatch):
    """Only arange(out=...) and in-place ops: every torch factory call that
    could allocate writes into our buffer."""
    md, _ = metadata(8)
    real_arange = torch.arange
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("out"))
        return real_arange(*args, **kwargs)

    monkeypatch.setattr(torch, "arange", spy)
    for name in ("empty", "zeros", "ones", "full", "tensor", "cumsum"):
        monkeypatch.setattr(torch, name, lambda *a, _n=name, **k: pytest.fail(f"torch.{_n} allocates"))
    be.fill_draft_extend_v2_cu_seqlens_q(md, NS(num_tokens_per_req=2), 6)
    assert len(calls) == 1 and calls[0] is not None
    assert calls[0].data_ptr() == md.cu_seqlens_q[1:].data_ptr()


def test_v1_values_are_not_what_v2_writes():
    """V2 ignores the accepted counts: the stride is fixed even when requests
    accepted different numbers of tokens (V1's cumsum would differ)."""
    md, _ = metadata(4)
    spec = NS(num_tokens_per_req=4, num_accept_tokens=torch.tensor([1, 4, 2, 3], dtype=torch.int32))
    be.fill_draft_extend_v2_cu_seqlens_q(md, spec, 4)
    assert md.cu_seqlens_q.tolist() == [0, 4, 8, 12, 16]
    assert torch.cumsum(spec.num_accept_tokens, 0).tolist() != md.cu_seqlens_q[1:].tolist()


class TestCaptureFallback:
    """num_tokens_per_req <= 0: the synthetic spec input of CUDA-graph capture."""

    def test_capture_stride_when_only_a_device_style_tensor_exists(self):
        # A tensor we must not read (stands for a GPU buffer): any host read fails.
        class DeviceTensor:
            device = NS(type="cuda")

            def __getitem__(self, _):
                raise AssertionError("read the device tensor")

        spec = NS(num_tokens_per_req=-1, num_accept_tokens=DeviceTensor(), num_accept_tokens_cpu=None)
        md, _ = metadata(4, capture_stride=3)
        assert be.fill_draft_extend_v2_cu_seqlens_q(md, spec, 4) == 3
        assert md.cu_seqlens_q.tolist() == [0, 3, 6, 9, 12]

    @pytest.mark.parametrize("unset", [-1, 0])
    def test_max_of_accepted_on_cpu(self, unset):
        # Capture fills num_accept_tokens[:bs] with the stride; the max is taken over [:bs] only.
        accepted = torch.tensor([3, 3, 3, 9], dtype=torch.int32)
        assert be.draft_extend_v2_stride(NS(num_tokens_per_req=unset, num_accept_tokens=accepted), 3) == 3
        assert be.draft_extend_v2_stride(NS(num_tokens_per_req=unset, num_accept_tokens=accepted), 4) == 9

    def test_host_mirror_first(self):
        spec = NS(num_tokens_per_req=-1, num_accept_tokens=None, num_accept_tokens_cpu=[2, 5, 1])
        assert be.draft_extend_v2_stride(spec, 3, capture_stride=7) == 5

    @pytest.mark.parametrize(
        "fields",
        [
            {"num_accepted_tokens": torch.tensor([4, 4], dtype=torch.int32)},  # 0.5.11
            {"accept_length": torch.tensor([4, 4], dtype=torch.int32), "accept_length_cpu": [1, 1]},  # 0.5.10
        ],
        ids=["0.5.11", "0.5.10"],
    )
    def test_older_field_names(self, fields):
        # 0.5.10's accept_length_cpu counts drafts (one less): not used.
        assert be.draft_extend_v2_stride(NS(num_tokens_per_req=-1, **fields), 2) == 4

    def test_nothing_to_infer_from(self):
        with pytest.raises(ValueError, match="num_tokens_per_req is unset"):
            be.draft_extend_v2_stride(NS(num_tokens_per_req=-1), 2)

    def test_device_read_is_the_last_resort(self):
        class Accepted:
            device = NS(type="meta")  # not host: only the explicit last-resort read may touch it

            def __getitem__(self, _):
                return NS(max=lambda: NS(item=lambda: 6))

        assert be.draft_extend_v2_stride(NS(num_tokens_per_req=0, num_accept_tokens=Accepted()), 2) == 6


def test_num_tokens_per_req_wins_and_is_never_a_tensor_read():
    class Boom:
        device = NS(type="cuda")

        def __getitem__(self, _):
            raise AssertionError("read accepted counts although num_tokens_per_req is set")

    assert be.draft_extend_v2_stride(NS(num_tokens_per_req=5, num_accept_tokens=Boom()), 3) == 5


def test_bad_buffers_are_refused():
    with pytest.raises(ValueError, match="bs \\+ 1"):
        be.fill_strided_cu_seqlens(torch.zeros(3, dtype=torch.int32), 4, 2)
    with pytest.raises(TypeError, match="int32"):
        be.fill_strided_cu_seqlens(torch.zeros(5, dtype=torch.int64), 4, 2)
    with pytest.raises(ValueError, match="positive"):
        be.fill_strided_cu_seqlens(torch.zeros(5, dtype=torch.int32), 4, 0)


def test_bs_zero_only_sets_the_leading_zero():
    buf = torch.full((3,), 7, dtype=torch.int32)
    be.fill_strided_cu_seqlens(buf, 0, 4)
    assert buf.tolist() == [0, 7, 7]


def test_device_read_refused_while_a_graph_is_being_captured(monkeypatch):
    """The last resort (.item() on a device tensor) would break a capture: refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)

    class Accepted:
        device = NS(type="cuda")

        def __getitem__(self, _):
            raise AssertionError("read the device tensor while capturing")

    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
        be.draft_extend_v2_stride(NS(num_tokens_per_req=-1, num_accept_tokens=Accepted()), 2)
    assert be.draft_extend_v2_stride(NS(num_tokens_per_req=-1, num_accept_tokens=Accepted()), 2, capture_stride=5) == 5
