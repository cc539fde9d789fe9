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
