"""flashinfer-host-indptr, run: the patched 0.5.12.post1 ``flashinfer_backend``
imported on CPU (no flashinfer there: its wrappers are recording fakes that
read their arrays on the host as FlashInfer's ``plan()`` does). "Device"
tensors are ``OnDevice``: a tensor subclass that records every read back to
the host (``.cpu()``, ``.to("cpu")``, ``.item()``, ``.tolist()``), so a test
sees each wait the stock path has and the patched one does not. The verify
replay, the eager draft extend and the multi-step draft (a padded replay)
run through the release's own methods; each checks the host arrays equal
what the device copy gives, padded rows included."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("triton")
pytest.importorskip("transformers")


MODULE = "sglang.srt.layers.attention.flashinfer_backend"
PATCH = "flashinfer-host-indptr"
SWITCH = "PATCHKIT_FLASHINFER_HOST_INDPTR"


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for a device one: its reads to the host are recorded."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = name == "to" and any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device")))
        if name in ("cpu", "item", "tolist") or to_host:
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs)


def on_device(values, dtype=torch.int32):
    return torch.as_tensor(values, dtype=dtype).as_subclass(OnDevice)


@pytest.fixture(scope="module")
def fi(load_patched):
    return load_patched("0.5.12.post1", PATCH, MODULE)


class FakeWrapper:
    """What the backend touches of a FlashInfer wrapper: ``begin_forward``,
    recorded, reading its indptrs (and packing a custom mask) on the host as
    FlashInfer's plan() does; the CUDA-graph mask buffers."""

    def __init__(self, graph_bs=0, host_reads=(0, 1, 3)):  # prefill: qo, kv, last page; decode: (0, 2)
        self.host_reads = host_reads
        self.plans, self.is_cuda_graph_enabled, self._backend = [], bool(graph_bs), "fa2"
        self._custom_mask_buf = torch.zeros(4096, dtype=torch.uint8) if graph_bs else None
        self._mask_indptr_buf = torch.zeros(graph_bs + 1, dtype=torch.int32) if graph_bs else None

    def begin_forward(self, *args, custom_mask=None, **kwargs):
        host = [args[i].to("cpu") for i in self.host_reads]  # plan()'s .to("cpu")
        if custom_mask is not None:  # segment_packbits' total, read back
            qo, kv = host[0], host[1]
            rows = (qo[1:] - qo[:-1]) * (kv[1:] - kv[:-1])
            int(torch.cumsum((rows + 7) // 8, 0)[-1].item())
        self.plans.append((args, custom_mask))


def reference_pack(mask, qo, kv):
    """numpy.packbits (little) of each request's qo_len * kv_len mask bits: FlashInfer's segment_packbits."""
    out, indptr, start = [], [0], 0
    for r in range(len(qo) - 1):
        n = int(qo[r + 1] - qo[r]) * int(kv[r + 1] - kv[r])
        packed = np.packbits(mask[start : start + n].numpy().astype(np.uint8), bitorder="little") if n else []
        out += list(packed)
        indptr.append(len(out))
        start += n
    return out, indptr


def prefill_updater(fi):
    up = object.__new__(fi.FlashInferIndicesUpdaterPrefill)
    up.num_qo_heads, up.num_kv_heads, up.head_dim = 8, 2, 64
    up.q_data_type = up.data_type = torch.bfloat16
    up.req_to_token = torch.zeros((8, 64), dtype=torch.int32)
    up.kv_indptr = [on_device([0] * 9)]
    up.qo_indptr = [on_device([0] * 9)]
    up.kv_last_page_len = on_device([1] * 8)
    up.prefill_wrapper_ragged = FakeWrapper(host_reads=(0, 1))
    up.token_to_kv_pool_allocator = None
    up.update = up.update_single_wrapper
    return up


def backend(fi, up):
    be = object.__new__(fi.FlashInferAttnBackend)
    be.dispatch_reason, be.indices_updater_prefill = None, up
    be.is_multimodal = be.enable_mis = be.enable_deterministic = be.use_paged = False
    be.prefill_wrappers_paged, be.prefill_split_tile_size = [FakeWrapper()], None
    return be


def verify_input(fi, ndt, mask):
    from sglang.srt.speculative import eagle_info
    from sglang.srt.speculative.spec_info import SpecInputType

    spec = object.__new__(eagle_info.EagleVerifyInput)
    spec.spec_input_type, spec.draft_token_num, spec.custom_mask = SpecInputType.EAGLE_VERIFY, ndt, mask
    return spec, mock.patch.object(eagle_info, "create_flashinfer_kv_indices_triton", mock.MagicMock())


@pytest.fixture(autouse=True)
def _host_plans_on(monkeypatch):
    """The host plans are off until PATCHKIT_FLASHINFER_HOST_INDPTR=1 (no GPU proof yet): on here."""
    monkeypatch.setenv(SWITCH, "1")


@pytest.mark.parametrize("mirror, switched", [(True, True), (True, False), (False, True)])
def test_a_padded_verify_replay_plans_from_the_mirror_without_reading_back(fi, monkeypatch, mirror, switched):
    """Host plans with the mirror and the switch on; the stock plan (reads back, as pristine)
    with the switch off (the default) or without the mirror."""
    if not switched:
        monkeypatch.delenv(SWITCH)
    patched = mirror and switched
    bs, ndt, fill = 4, 3, 1  # a graph of 4 replayed for 2 requests: rows 2, 3 padded (fill value 1)
    seq_lens_cpu = torch.tensor([7, 5, fill, fill], dtype=torch.int32)
    mask = (torch.rand(int((seq_lens_cpu + ndt).sum()) * ndt + 50) < 0.5).as_subclass(OnDevice)
    spec, kernel = verify_input(fi, ndt, mask)
    device_args = spec.generate_attn_arg_prefill  # the release's own; its arrays live on the device
    spec.generate_attn_arg_prefill = lambda *a: tuple(
        t.as_subclass(OnDevice) if isinstance(t, torch.Tensor) else t for t in device_args(*a)
    )
    up = prefill_updater(fi)
    be = backend(fi, up)
    be.prefill_cuda_graph_metadata = {bs: [FakeWrapper(graph_bs=bs)]}
    OnDevice.reads.clear()
    with kernel:
        mirror = seq_lens_cpu if mirror else None  # without the mirror: the stock plan, as pristine's
        be.init_forward_metadata_replay_cuda_graph(
            bs, on_device(range(bs)), on_device(seq_lens_cpu), int(seq_lens_cpu.sum()), None,
            fi.ForwardMode.TARGET_VERIFY, spec, mirror,
        )  # fmt: skip
    wrapper = be.prefill_cuda_graph_metadata[bs][0]
    ((args, custom_mask),) = wrapper.plans
    qo = torch.arange(0, (bs + 1) * ndt, ndt, dtype=torch.int32)  # what generate_attn_arg_prefill builds
    kv = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(seq_lens_cpu + ndt, 0).int()])
    assert (
        torch.equal(args[0], qo)
        and torch.equal(args[1], kv)
        and torch.equal(args[3], torch.ones(bs, dtype=torch.int32))
    )
    if not patched:
        assert custom_mask is not None and OnDevice.reads  # stock: the indptrs and the mask's total read back
        return
    assert OnDevice.reads == []  # nothing read back from the device
    assert not isinstance(args[1], OnDevice) and args[1].device.type == "cpu" and custom_mask is None
    packed, indptr = reference_pack(mask.as_subclass(torch.Tensor), qo, kv)
    assert wrapper._custom_mask_buf[: len(packed)].tolist() == packed  # the bytes plan() would have put there
    assert wrapper._mask_indptr_buf[: bs + 1].tolist() == indptr


def test_the_eager_draft_extend_plans_from_the_host_prefix_lengths(fi):
    up = prefill_updater(fi)
    be = backend(fi, up)
    prefix = [6, 9, 4]
    seq_lens = torch.tensor(prefix) + 4
    batch = SimpleNamespace(
        forward_mode=fi.ForwardMode.DRAFT_EXTEND_V2, req_pool_indices=on_device([0, 1, 2]), seq_lens=on_device(seq_lens),
        seq_lens_cpu=seq_lens.int(), seq_lens_sum=int(seq_lens.sum()), extend_prefix_lens=on_device(prefix),
        extend_prefix_lens_cpu=prefix, encoder_lens=None, cross_attention_custom_mask=None, spec_info=None,
    )  # fmt: skip
    OnDevice.reads.clear()
    with mock.patch.object(fi, "create_flashinfer_kv_indices_triton", mock.MagicMock()):
        be.init_forward_metadata(batch)
    assert OnDevice.reads == []  # no .sum().item(), no plan read back
    ((ragged, _),) = up.prefill_wrapper_ragged.plans
    ((paged, _),) = be.prefill_wrappers_paged[0].plans
    assert ragged[0].tolist() == ragged[1].tolist() == [0, 4, 8, 12]  # cumsum(seq_lens - prefix), as on the device
    assert paged[1].tolist() == [0, 6, 15, 19]  # cumsum(prefix): the ragged extend's cached part
    assert torch.equal(up.qo_indptr[0][:4].as_subclass(torch.Tensor), paged[0])  # the device's own numbers


def draft_kernel(indptr, positions, steps, rows):
    """generate_draft_decode_kv_indices' indptr writes: [s][r] = sum(positions[:r]) + r * (s + 1), r in 1..rows."""

    def launch(*args):
        for s in range(steps):
            for r in range(1, rows + 1):
                indptr[s, r] = int(positions[:r].as_subclass(torch.Tensor).sum()) + r * (s + 1)

    return launch


def test_a_padded_draft_replay_overrides_with_the_device_numbers_and_reads_nothing_back(fi):
    topk, steps, num_seqs, raw = 2, 3, 4, 3  # a graph of 4 replayed for 3 requests: one padded request
    seq_lens = [9, 4, 7]
    positions = torch.zeros(num_seqs * topk, dtype=torch.int64)  # the runner zeroes them when it pads
    positions[: raw * topk] = torch.tensor(seq_lens).repeat_interleave(topk)
    draft = object.__new__(fi.FlashInferMultiStepDraftBackend)
    draft.topk, draft.speculative_num_steps, draft.pool_len, draft.page_size = topk, steps, 64, 1
    draft.kv_indptr = on_device(torch.zeros((steps, 16), dtype=torch.int32))
    draft.generate_draft_decode_kv_indices = {
        (steps, num_seqs, topk): draft_kernel(draft.kv_indptr, positions, steps, num_seqs * topk)
    }
    spec = SimpleNamespace(positions=on_device(positions[: raw * topk]), is_draft_input=lambda: True)
    batch = SimpleNamespace(
        batch_size=num_seqs, seq_lens_sum=sum(seq_lens), spec_info=spec, seq_lens=on_device(seq_lens + [1]),
        seq_lens_cpu=torch.tensor(seq_lens + [1], dtype=torch.int32), req_pool_indices=None,
        req_to_token_pool=SimpleNamespace(req_to_token=None), positions=on_device(positions),
    )  # fmt: skip
    seen = []
    OnDevice.reads.clear()
    draft.common_template(
        batch, torch.zeros((steps, 256), dtype=torch.int32), lambda i, fb: seen.append(fi.global_override_indptr_cpu)
    )
    assert OnDevice.reads == []  # no .cpu() of the whole indptr
    rows = num_seqs * topk
    for i, host in enumerate(seen):  # padded rows included: what the .cpu() copy would have given
        assert host.tolist() == draft.kv_indptr[i, : rows + 1].tolist()
    # Eager, the stock decode plan is handed that host copy and host last-page lengths.
    dec = object.__new__(fi.FlashInferIndicesUpdaterDecode)
    dec.kv_last_page_len, dec.num_qo_heads, dec.num_kv_heads, dec.head_dim = on_device([1] * 8), 8, 2, 64
    dec.data_type = dec.q_data_type = torch.bfloat16
    wrapper = FakeWrapper(host_reads=(0, 2))
    fi.global_override_indptr_cpu = seen[0]
    OnDevice.reads.clear()
    try:
        with mock.patch.object(fi, "fast_decode_plan", object(), create=True):
            dec.call_begin_forward(
                wrapper,
                None,
                None,
                0,
                None,
                None,
                SimpleNamespace(kv_indptr=draft.kv_indptr[0, : rows + 1], kv_indices=None),
                None,
            )
    finally:
        fi.global_override_indptr_cpu = None
    ((args, _),) = wrapper.plans
    assert args[0] is seen[0] and args[2].tolist() == [1] * rows and OnDevice.reads == []
