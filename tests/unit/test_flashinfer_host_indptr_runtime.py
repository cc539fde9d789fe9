"""backends.flashinfer_host_indptr on its own: the mask packing equals
numpy.packbits per segment (FlashInfer's segment_packbits, little), and the
host builders refuse what they cannot make equal to the device arrays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from patchkit.backends import flashinfer_host_indptr as fhi  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
def test_packing_equals_segment_packbits(seed):
    gen = np.random.default_rng(seed)
    bits = [int(n) for n in gen.integers(0, 40, size=int(gen.integers(0, 7)))]
    mask = torch.from_numpy(gen.random(sum(bits) + 9) < 0.5)  # longer than the rows: as sglang pads it
    packed, indptr = fhi.pack_mask_segments(mask, bits)
    expected, offsets, start = [], [0], 0
    for n in bits:
        expected += list(np.packbits(mask[start : start + n].numpy().astype(np.uint8), bitorder="little")) if n else []
        offsets.append(len(expected))
        start += n
    assert packed.tolist() == expected and indptr.tolist() == offsets and indptr.dtype == torch.int32


def test_the_packing_sends_its_row_vectors_in_one_copy(monkeypatch):
    """The GPU run of 2026-11-28 (docs/gpu.md) counted five host waits a verify step in
    the packing: four row vectors copied from pageable memory one by one, and the bit
    weights made from a host list. Now: one copy of one host tensor (pinned on CUDA), no
    tensor made from a host list on the device."""
    copies, made = [], []
    to, tensor = torch.Tensor.to, torch.tensor

    def counting_to(self, *args, **kwargs):
        if self.device.type == "cpu" and (args[:1] == (torch.device("cpu"),) or kwargs.get("device") is not None):
            copies.append(tuple(self.shape))
        return to(self, *args, **kwargs)

    def counting_tensor(data, *args, **kwargs):
        if kwargs.get("device") is not None:
            made.append(data)
        return tensor(data, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    monkeypatch.setattr(torch, "tensor", counting_tensor)
    packed, _ = fhi.pack_mask_segments(torch.ones(40, dtype=torch.bool), [9, 0, 16, 3])
    assert copies == [(4, 4)] and made == []
    assert packed.tolist() == [255, 1, 255, 255, 7]


@pytest.fixture(autouse=True)
def _host_plans_on(monkeypatch):
    monkeypatch.setenv(fhi.SWITCH, "1")


def test_the_host_plans_are_off_by_default(monkeypatch):
    """Until a GPU run compares outputs (issue 71), every builder hands the stock plan back."""
    monkeypatch.delenv(fhi.SWITCH)
    lens = torch.tensor([5, 2, 1], dtype=torch.int32)
    assert fhi.verify_host_plan(SimpleNamespace(dispatch_reason=None), verify_spec(2), lens, 3, 8) is None
    assert fhi.draft_extend_host_plan(None, None, True) is None
    assert fhi.draft_host_indptr(None, 1, 3) is None
    monkeypatch.setenv(fhi.SWITCH, "1")
    assert fhi.verify_host_plan(SimpleNamespace(dispatch_reason=None), verify_spec(2), lens, 3, 8) is not None


def verify_spec(n):
    return SimpleNamespace(spec_input_type=SimpleNamespace(name="EAGLE_VERIFY"), draft_token_num=n)


def test_the_verify_plan_is_the_device_one_and_refused_on_a_stale_mirror():
    backend = SimpleNamespace(dispatch_reason=None)
    lens = torch.tensor([5, 2, 1], dtype=torch.int32)
    plan = fhi.verify_host_plan(backend, verify_spec(2), lens, 3, 8)
    assert plan.qo_indptr.tolist() == [0, 2, 4, 6] and plan.kv_indptr.tolist() == [0, 7, 11, 14]
    assert plan.last_page_len.tolist() == [1, 1, 1] and plan.kv_len_sum == 14
    assert fhi.verify_host_plan(backend, verify_spec(2), lens, 3, 9) is None  # sum disagrees: device arrays
    assert fhi.verify_host_plan(SimpleNamespace(dispatch_reason="window"), verify_spec(2), lens, 3, 8) is None
    other = SimpleNamespace(spec_input_type=SimpleNamespace(name="DFLASH_VERIFY"), draft_token_num=2)
    assert fhi.verify_host_plan(backend, other, lens, 3, 8) is None


def test_the_draft_indptr_counts_padded_rows_as_zero_positions():
    spec = SimpleNamespace(positions=torch.zeros(4))  # 2 live requests, topk 2
    batch = SimpleNamespace(
        seq_lens_cpu=torch.tensor([3, 5, 1], dtype=torch.int32), spec_info=spec, batch_size=3, seq_lens_sum=8
    )
    indptr = fhi.draft_host_indptr(batch, 2, 2)
    # rows 3, 3, 5, 5, then the padded request's two rows at position 0; step s adds s + 1 a row
    assert indptr[0].tolist() == [0, 4, 8, 14, 20, 21, 22]
    assert indptr[1].tolist() == [0, 5, 10, 17, 24, 26, 28]
    batch.seq_lens_sum = 9  # a mirror that is not the batch's: the device copy
    assert fhi.draft_host_indptr(batch, 2, 2) is None
    batch.spec_info = SimpleNamespace(positions=None)  # capture: no draft positions
    assert fhi.draft_host_indptr(batch, 2, 2) is None


class Paged:
    """A paged prefill wrapper as FlashInfer's: ``plan`` takes ``seq_lens`` (0.6.x)."""

    is_cuda_graph_enabled = False
    _backend = "fa2"

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, *args, seq_lens=None, custom_mask=None, **kw):
        self.got = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "seq_lens": seq_lens, "args": args}

    begin_forward = plan


class OldPaged(Paged):
    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, *args, custom_mask=None, **kw):
        self.got = {"kv_indptr": kv_indptr, "kwargs": kw}

    begin_forward = plan


def test_the_paged_plan_gets_the_k_lengths_from_the_host():
    """2026-11-28e counted one wait a paged plan inside FlashInfer's plan(): the K lengths it
    makes on the host (pageable) and sends to the device. Handed over as seq_lens (pinned on
    CUDA), they are the numbers plan() would make: the K indptr's differences, int32."""
    plan = fhi.verify_host_plan(SimpleNamespace(dispatch_reason=None), verify_spec(2), torch.tensor([5, 2, 1]), 3, 8)
    device = torch.zeros(4, dtype=torch.int32)
    wrapper = Paged()
    fhi.paged_plan_from_host(wrapper, plan)(device, device, device, device[:3], 8, 8, 64, 1)
    lens = wrapper.got["seq_lens"]
    assert lens.tolist() == [7, 4, 3] and lens.dtype == torch.int32
    assert lens.tolist() == (wrapper.got["kv_indptr"][1:] - wrapper.got["kv_indptr"][:-1]).tolist()
    old = OldPaged()  # a plan() without the argument: not given it
    fhi.paged_plan_from_host(old, plan)(device, device, device, device[:3], 8, 8, 64, 1)
    assert "seq_lens" not in old.got["kwargs"] and old.got["kv_indptr"] is plan.kv_indptr
    cudnn = Paged()
    cudnn._backend = "cudnn"  # reads seq_lens at run time as well: left as it was
    fhi.paged_plan_from_host(cudnn, plan)(device, device, device, device[:3], 8, 8, 64, 1)
    assert cudnn.got["seq_lens"] is None


def test_the_eager_decode_plan_sends_a_pinned_range(monkeypatch):
    """The eager decode plan's qo_indptr is FlashInfer's cached CPU range: replaced once by the
    same numbers pinned (2026-11-28e: one wait a draft decode step); a graph's plan sends none."""
    import sys

    cache: dict = {}

    def get_range(n, device):
        size = 1 << (n - 1).bit_length()
        buf = cache.setdefault((f"range_{size}", device), torch.arange(size, dtype=torch.int32))
        return buf[:n]

    pinned = []
    monkeypatch.setitem(sys.modules, "flashinfer", SimpleNamespace(utils=None))
    monkeypatch.setitem(sys.modules, "flashinfer.utils", SimpleNamespace(_get_range_buf=get_range, _cache_buf=cache))
    sys.modules["flashinfer"].utils = sys.modules["flashinfer.utils"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self) or self)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: any(self is p for p in pinned))
    monkeypatch.setattr(fhi, "_host_ones", lambda n: torch.ones(n, dtype=torch.int32))  # not this test's subject
    planned = []
    wrapper = SimpleNamespace(is_cuda_graph_enabled=False, begin_forward=lambda *a, **k: planned.append(a))
    host = torch.arange(6, dtype=torch.int32)
    fhi.decode_plan_from_host(wrapper, host)(host, host, host[:5], 8, 8, 64, 1)
    (buf,) = cache.values()
    assert list(cache) == [("range_8", "cpu")] and buf.is_pinned() and buf.tolist() == list(range(8))
    assert get_range(6, "cpu").tolist() == list(range(6)) and planned[0][0] is host
    cache.clear()
    wrapper.is_cuda_graph_enabled = True
    fhi.decode_plan_from_host(wrapper, host)(host, host, host[:5], 8, 8, 64, 1)
    assert cache == {}


def test_each_builder_makes_one_fresh_host_array_and_shares_only_constants(monkeypatch):
    """2026-11-29's profile read 13 pin_memory calls a step. Now one fresh (pinned on CUDA)
    allocation a builder; the arrays that are the same numbers every step (the verify's
    qo_indptr, the last-page ones) are made once. The varying arrays are never handed out
    twice: a queued copy may still read them."""
    made = []
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(a) or empty(*a, **k))
    backend, lens = SimpleNamespace(dispatch_reason=None), torch.tensor([5, 2, 1], dtype=torch.int32)
    first = fhi.verify_host_plan(backend, verify_spec(2), lens, 3, 8)
    made.clear()
    second = fhi.verify_host_plan(backend, verify_spec(2), lens, 3, 8)
    assert len(made) == 1 and second.qo_indptr is first.qo_indptr and second.last_page_len is first.last_page_len
    assert second.kv_indptr.untyped_storage().data_ptr() != first.kv_indptr.untyped_storage().data_ptr()
    assert second.kv_indptr.tolist() == first.kv_indptr.tolist() == [0, 7, 11, 14]
    assert second.kv_lens.tolist() == [7, 4, 3] and second.kv_len_sum == 14
    batch = SimpleNamespace(
        seq_lens_cpu=lens,
        spec_info=SimpleNamespace(positions=torch.zeros(3)),
        batch_size=3,
        seq_lens_sum=8,
        forward_mode=SimpleNamespace(is_draft_extend_v2=lambda: True),
        extend_prefix_lens_cpu=[4, 1, 0],
    )
    made.clear()
    extend = fhi.draft_extend_host_plan(backend, batch, use_ragged=True)
    assert extend.qo_indptr.tolist() == [0, 1, 2, 3] and extend.kv_indptr.tolist() == [0, 4, 5, 5]
    assert fhi.draft_host_indptr(batch, 1, 3).tolist() == [[0, 6, 9, 11], [0, 7, 11, 14], [0, 8, 13, 17]]
    assert fhi._host_ones(3) is fhi._host_ones(3) and fhi._host_ones(3).tolist() == [1, 1, 1]
    assert len(made) == 2
