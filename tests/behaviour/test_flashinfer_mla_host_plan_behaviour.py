"""flashinfer-mla-host-plan, run: the patched 0.5.12.post1 ``flashinfer_mla_backend``
imported on CPU (no flashinfer there: its wrapper is a recording fake), the
target verify's replay, its capture and the eager draft extend driven with
the arguments sglang passes, and the paged plan checked to receive host
arrays equal to the device ones it received before."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")


MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
PATCH = "flashinfer-mla-host-plan"


@pytest.fixture(scope="module")
def mla(load_patched):
    return load_patched("0.5.12.post1", PATCH, MODULE)


class FakeWrapper:
    """What the backend touches of a BatchMLAPagedAttentionWrapper: plan(),
    recorded; and, for the fast plan, its CUDA-graph buffers and module."""

    def __init__(self, *args, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, **kwargs):
        self.plans = []
        # A CUDA-graph wrapper keeps the buffers it was built with (slices of the backend's).
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._float_workspace_buffer = self._int_workspace_buffer = self._pin_memory_int_workspace_buffer = None
        self._cached_module = SimpleNamespace(plan=lambda *a: self.plans.append(("module", a)))

    def plan(self, *args):
        self.plans.append(("plan", args))


def device_plan(seq_lens, ndt):
    """What generate_attn_arg_prefill hands the verify plan on the device (EagleVerifyInput's shape)."""
    bs = len(seq_lens)
    qo = torch.arange(0, (bs + 1) * ndt, ndt, dtype=torch.int32)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(seq_lens + ndt, dim=0)
    return qo, kv


def updater(mla):
    up = object.__new__(mla.FlashInferMLAIndicesUpdaterPrefill)
    up.scaling, up.num_local_heads, up.kv_lora_rank, up.qk_rope_head_dim = 0.1, 16, 512, 64
    up.q_data_type = up.data_type = torch.bfloat16
    up.req_to_token = torch.zeros((4, 64), dtype=torch.int32)
    up.kv_indptr = torch.zeros(8, dtype=torch.int32)
    up.qo_indptr = torch.zeros(8, dtype=torch.int32)
    up.prefill_wrapper_ragged = None
    return up


def verify_spec(seq_lens, ndt):
    qo, kv = device_plan(seq_lens, ndt)
    indices = torch.arange(int(kv[-1]), dtype=torch.int32)
    return SimpleNamespace(draft_token_num=ndt, generate_attn_arg_prefill=lambda *a: (indices, kv, qo, None))


def test_the_paged_plan_gets_the_host_arrays_when_given_and_the_device_ones_otherwise(mla):
    seq_lens = torch.tensor([5, 9, 2], dtype=torch.int32)
    spec = verify_spec(seq_lens, 3)
    host = mla.verify_host_plan(seq_lens, 3, 3)
    with mock.patch.object(mla, "SpecInput", object):
        given, stock = FakeWrapper(), FakeWrapper()
        up = updater(mla)
        up.update(None, seq_lens, 16, None, given, False, spec, *host)
        up.update(None, seq_lens, 16, None, stock, False, spec)
    (_, g), (_, s) = given.plans[0], stock.plans[0]
    assert g[0] is host[0] and g[1] is host[1] and g[3] is host[2]  # no copy, no device tensor
    assert s[0] is not host[0] and all(torch.equal(a, b) for a, b in zip(g[:4], s[:4]))  # the same numbers
    assert g[4:] == s[4:]


def backend(mla, bs):
    be = object.__new__(mla.FlashInferMLAAttnBackend)
    be.indices_updater_prefill = mock.Mock()
    be.prefill_cuda_graph_metadata = {bs: FakeWrapper()}
    be.workspace_buffer = None
    be.cuda_graph_qo_indptr = torch.zeros(8, dtype=torch.int32)
    be.cuda_graph_kv_indptr = torch.zeros(8, dtype=torch.int32)
    be.cuda_graph_kv_indices = torch.zeros(64, dtype=torch.int32)
    be.cuda_graph_kv_lens = torch.ones(7, dtype=torch.int32)
    be.prefill_wrapper_paged = FakeWrapper()
    return be


@pytest.mark.parametrize("mirror", [True, False])
def test_the_verify_replay_hands_over_the_mirrors_arrays(mla, mirror):
    bs, ndt = 3, 4
    seq_lens = torch.tensor([7, 3, 1], dtype=torch.int32)
    be = backend(mla, bs)
    spec = SimpleNamespace(draft_token_num=ndt)
    be.init_forward_metadata_replay_cuda_graph(
        bs, torch.arange(bs), seq_lens, 11, None, mla.ForwardMode.TARGET_VERIFY, spec, seq_lens if mirror else None
    )
    kwargs = be.indices_updater_prefill.update.call_args.kwargs
    if not mirror:
        assert kwargs["qo_indptr_cpu"] is kwargs["kv_indptr_cpu"] is kwargs["kv_len_arr_cpu"] is None
        return
    qo, kv = device_plan(seq_lens, ndt)
    assert torch.equal(kwargs["qo_indptr_cpu"], qo) and torch.equal(kwargs["kv_indptr_cpu"], kv)
    assert torch.equal(kwargs["kv_len_arr_cpu"], seq_lens + ndt)
    assert all(kwargs[k].device.type == "cpu" for k in ("qo_indptr_cpu", "kv_indptr_cpu", "kv_len_arr_cpu"))


def test_capture_installs_the_fast_plan_which_plans_from_host_arrays(mla):
    bs, ndt = 2, 3
    be = backend(mla, bs)
    with mock.patch.object(mla, "BatchMLAPagedAttentionWrapper", FakeWrapper, create=True):
        be.init_forward_metadata_capture_cuda_graph(
            bs, bs * ndt, torch.arange(bs), torch.tensor([4, 6]), None, mla.ForwardMode.TARGET_VERIFY, None
        )
    wrapper = be.prefill_cuda_graph_metadata[bs]
    assert wrapper.plan.func is mla.fast_mla_prefill_plan and wrapper.plan.args == (wrapper,)
    seq_lens = torch.tensor([4, 6], dtype=torch.int32)
    qo, kv, lens = mla.verify_host_plan(seq_lens, bs, ndt)
    indices = torch.arange(int(kv[-1]), dtype=torch.int32)
    wrapper.plan(qo, kv, indices, lens, 16, 512, 64, 1, True, 0.1, torch.bfloat16, torch.bfloat16)
    (kind, args), *_ = wrapper.plans
    assert kind == "module" and args[3] is qo and args[4] is kv and args[5] is lens  # host arrays, as given
    assert torch.equal(wrapper._kv_indptr_buf[: bs + 1], kv) and torch.equal(wrapper._kv_len_arr_buf[:bs], lens)
    assert torch.equal(wrapper._kv_indices_buf[: len(indices)], indices)


def test_the_eager_draft_extend_plans_from_the_host_lengths(mla):
    be = backend(mla, 2)
    batch = SimpleNamespace(
        forward_mode=mla.ForwardMode.DRAFT_EXTEND_V2,
        req_pool_indices=torch.arange(2),
        seq_lens=torch.tensor([9, 12]),
        seq_lens_cpu=torch.tensor([9, 12]),
        seq_lens_sum=21,
        extend_prefix_lens=torch.tensor([5, 8]),
        extend_prefix_lens_cpu=[5, 8],
        extend_seq_lens_cpu=[4, 4],
        batch_size=2,
    )
    args = SimpleNamespace(flashinfer_mla_disable_ragged=False)
    with mock.patch.object(mla, "get_global_server_args", return_value=args):
        be.init_forward_metadata(batch)
        kwargs = be.indices_updater_prefill.update.call_args.kwargs
        assert torch.equal(kwargs["qo_indptr_cpu"], torch.tensor([0, 4, 8], dtype=torch.int32))
        assert torch.equal(kwargs["kv_indptr_cpu"], torch.tensor([0, 9, 21], dtype=torch.int32))
        assert torch.equal(kwargs["kv_len_arr_cpu"], torch.tensor([9, 12], dtype=torch.int32))
        batch.forward_mode = mla.ForwardMode.EXTEND  # a prefill keeps the stock plan
        be.init_forward_metadata(batch)
        assert be.indices_updater_prefill.update.call_args.kwargs["kv_indptr_cpu"] is None


def eager_batch(mla, mode, seq_lens, spec):
    return SimpleNamespace(
        forward_mode=mode,
        req_pool_indices=torch.arange(len(seq_lens)),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()),
        spec_info=spec,
        batch_size=len(seq_lens),
    )


def test_an_eager_verify_hands_over_the_mirrors_arrays(mla):
    """Past the captured sizes the verify runs eagerly: its plan arrays come from the mirror too."""
    seq_lens, ndt = torch.tensor([7, 3, 1], dtype=torch.int32), 4
    be = backend(mla, 3)
    be.prefill_wrapper_verify = FakeWrapper()
    be.init_forward_metadata(eager_batch(mla, mla.ForwardMode.TARGET_VERIFY, seq_lens, verify_spec(seq_lens, ndt)))
    kwargs = be.indices_updater_prefill.update.call_args.kwargs
    qo, kv = device_plan(seq_lens, ndt)
    assert torch.equal(kwargs["qo_indptr_cpu"], qo) and torch.equal(kwargs["kv_indptr_cpu"], kv)
    assert torch.equal(kwargs["kv_len_arr_cpu"], seq_lens + ndt)


class NoKernel:
    """create_flashinfer_kv_indices_triton on CPU: the indices are not what is checked here."""

    def __getitem__(self, grid):
        return lambda *args: None


def decode_updater(mla):
    up = object.__new__(mla.FlashInferMLAIndicesUpdaterDecode)
    up.scaling, up.num_local_heads, up.kv_lora_rank, up.qk_rope_head_dim = 0.1, 16, 512, 64
    up.data_type = torch.bfloat16
    up.req_to_token = torch.zeros((4, 64), dtype=torch.int32)
    up.kv_indptr = torch.zeros(8, dtype=torch.int32)
    up.q_indptr = torch.arange(8, dtype=torch.int32)
    return up


@pytest.mark.parametrize("draft", [True, False])
def test_an_eager_draft_decode_plans_from_host_arrays_equal_to_the_device_ones(mla, draft):
    """The real decode updater, driven by init_forward_metadata's decode branch: a spec-v2 draft
    decode's plan gets fresh host arrays, the very numbers it built on the device before; any
    other decode (no draft input) keeps the updater's own arrays."""
    seq_lens = torch.tensor([9, 4, 12], dtype=torch.int32)
    spec = SimpleNamespace(is_draft_input=lambda: draft)
    be = backend(mla, 3)
    be.indices_updater_decode, be.decode_wrapper = decode_updater(mla), FakeWrapper()
    cpu_empty = torch.empty
    with (
        mock.patch.object(mla, "create_flashinfer_kv_indices_triton", NoKernel()),
        mock.patch("torch.empty", lambda *a, device=None, **k: cpu_empty(*a, **k)),
    ):
        be.init_forward_metadata(eager_batch(mla, mla.ForwardMode.DECODE, seq_lens, spec))
        stock = FakeWrapper()
        be.indices_updater_decode.update(torch.arange(3), seq_lens, 25, decode_wrapper=stock)
    (_, got), (_, want) = be.decode_wrapper.plans[0], stock.plans[0]
    assert all(torch.equal(a, b) for a, b in zip((got[0], got[1], got[3]), (want[0], want[1], want[3])))
    assert got[4:] == want[4:]
    buffers = be.indices_updater_decode.kv_indptr.data_ptr(), be.indices_updater_decode.q_indptr.data_ptr()
    assert (got[0].data_ptr() not in buffers and got[1].data_ptr() not in buffers) is draft
