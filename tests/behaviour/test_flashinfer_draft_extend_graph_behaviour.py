"""flashinfer-draft-extend-graph, run: the patched 0.5.12.post1 ``flashinfer_backend``
imported on CPU (no flashinfer there). Its CUDA-graph paged prefill wrapper is
a fake that plans as FlashInfer 0.6.11.post1's ``plan()`` does in CUDA-graph
mode (``.to("cpu")`` of its indptrs, the lengths from them, the graph buffers
filled, ``_cached_module.plan`` called with the host arrays), its module a
recorder. "Device" tensors are ``OnDevice``: every read back to the host
(``.cpu()``, ``.to("cpu")``, ``.item()``, ``.tolist()``, ``int()``, ``bool()``) is
recorded. The release's own capture and replay metadata methods run for
``DRAFT_EXTEND_V2``; the replay's plan inputs are compared with what the
release's eager path plans for the same batch."""

from __future__ import annotations

import importlib
import itertools
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
RUNTIME = "sglang.srt._patchkit.backends.flashinfer_draft_extend_graph"
PATCH = "flashinfer-draft-extend-graph"
SWITCH = "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH"
STRIDE, MAX_BS, POOL = 4, 8, 64


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for a device one: its reads to the host are recorded."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = name == "to" and any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device")))
        if name in ("cpu", "item", "tolist", "__int__", "__index__", "__bool__", "__float__") or to_host:
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs)


def on_device(values, dtype=torch.int32):
    return torch.as_tensor(values, dtype=dtype).as_subclass(OnDevice)


def plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t


class FakeModule:
    """FlashInfer's compiled prefill module: ``plan`` records its arguments and
    returns a plan info made of them (a different input gives a different info)."""

    def __init__(self):
        self.calls = []

    def plan(self, *args):
        self.calls.append(args)
        qo, kv, kv_lens = (plain(a).tolist() for a in args[3:6])
        return [*qo, -1, *kv, -1, *kv_lens, *args[6:11], int(args[11]), *args[12:]]


class FakeGraphWrapper:
    """``BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True)``: ``plan()`` as
    FlashInfer 0.6.11.post1 runs it at page size 1, fa2, no mask."""

    def __init__(self, workspace, layout, backend, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
                 paged_kv_indices_buf, paged_kv_last_page_len_buf):  # fmt: skip
        assert use_cuda_graph and layout == "NHD"
        self.is_cuda_graph_enabled, self._backend, self._jit_module = True, backend, None
        self._qo_indptr_buf, self._paged_kv_indptr_buf = qo_indptr_buf, paged_kv_indptr_buf
        self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = paged_kv_indices_buf, paged_kv_last_page_len_buf
        self._fixed_batch_size = len(qo_indptr_buf) - 1
        self._kv_lens_buffer = torch.zeros(self._fixed_batch_size, dtype=torch.int32)
        self._max_total_num_rows, self._cached_module = None, None
        self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer = "f", "i", "p"
        self.stock_plans = 0

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, causal=False,
             window_left=-1, q_data_type="float16", kv_data_type=None, non_blocking=True,
             fixed_split_size=None, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None):  # fmt: skip
        # seq_lens: FlashInfer's documented argument (2026-11-28f: a fake without it hid a
        # host plan that raised on the GPU when flashinfer-host-indptr handed the K lengths over)
        assert custom_mask is None and page_size == 1
        self.stock_plans += 1
        head_dim_vo = head_dim_vo or head_dim_qk
        batch_size = len(qo_indptr) - 1
        self._batch_size, self._num_qo_heads, self._num_kv_heads = batch_size, num_qo_heads, num_kv_heads
        self._prefix_len_ptr, self._token_pos_in_items_ptr = prefix_len_ptr, token_pos_in_items_ptr
        self._token_pos_in_items_len, self._max_item_len_ptr = token_pos_in_items_len, max_item_len_ptr
        qo_host = plain(qo_indptr.to("cpu"))
        self._qo_indptr_last = int(qo_host[-1])
        total_num_rows = self._qo_indptr_last
        self._max_q_len = max(qo_host[1:] - qo_host[:-1]).item()
        kv_host, last_host = plain(paged_kv_indptr.to("cpu")), plain(paged_kv_last_page_len.to("cpu"))
        kv_lens = torch.clamp(kv_host[1:] - kv_host[:-1] - 1, min=0) * page_size + last_host
        if seq_lens is not None:
            kv_lens = plain(seq_lens.cpu()).flatten()
        self._kv_lens_buffer[: len(kv_lens)].copy_(kv_lens)
        self._max_kv_len = max(kv_lens).item()
        if self._max_total_num_rows is None:
            self._max_total_num_rows = total_num_rows
        assert total_num_rows <= self._max_total_num_rows and batch_size == self._fixed_batch_size
        self._qo_indptr_buf.copy_(qo_indptr)
        self._paged_kv_indptr_buf.copy_(paged_kv_indptr)
        self._paged_kv_last_page_len_buf.copy_(paged_kv_last_page_len)
        self._paged_kv_indices_buf[: len(paged_kv_indices)].copy_(paged_kv_indices)
        if self._cached_module is None:
            self._cached_module = FakeModule()
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer,
            qo_host, kv_host, kv_lens, self._max_total_num_rows or total_num_rows, batch_size, num_qo_heads,
            num_kv_heads, page_size, self.is_cuda_graph_enabled, head_dim_qk, head_dim_vo, causal, window_left,
            fixed_split_size or -1, False, 0,
        )  # fmt: skip

    begin_forward = plan


class EagerWrapper:
    """The eager paged wrapper: records what it is planned with."""

    def __init__(self):
        self.plans = []

    def begin_forward(self, *args, **kwargs):
        self.plans.append(tuple(plain(a).clone() if isinstance(a, torch.Tensor) else a for a in args[:4]))


def kv_indices(req_to_token, req_pool_indices, lens, indptr, start, out, stride):
    """``create_flashinfer_kv_indices_triton`` on CPU: each request's first
    ``lens[r]`` token slots, written at ``indptr[r]``."""
    for r in range(len(lens)):
        n, at, req = (int(plain(x)[r]) for x in (lens, indptr, req_pool_indices))
        plain(out)[at : at + n] = plain(req_to_token)[req, :n]


class Kernel:
    def __getitem__(self, grid):
        return kv_indices


@pytest.fixture(scope="module")
def fi(load_patched):
    return load_patched("0.5.12.post1", PATCH, MODULE)


@pytest.fixture(autouse=True)
def _fakes(fi, monkeypatch):
    monkeypatch.setattr(fi, "BatchPrefillWithPagedKVCacheWrapper", FakeGraphWrapper, raising=False)
    monkeypatch.setattr(fi, "create_flashinfer_kv_indices_triton", Kernel())


def make_backend(fi, req_to_token):
    up = object.__new__(fi.FlashInferIndicesUpdaterPrefill)
    up.num_qo_heads, up.num_kv_heads, up.head_dim = 8, 2, 64
    up.q_data_type = up.data_type = torch.bfloat16
    up.req_to_token = req_to_token
    up.kv_indptr = [on_device([0] * (MAX_BS + 1))]
    up.qo_indptr = [on_device([0] * (MAX_BS + 1))]
    up.kv_last_page_len = on_device([1] * MAX_BS)
    up.prefill_wrapper_ragged = EagerWrapper()
    up.token_to_kv_pool_allocator = None
    up.update = up.update_single_wrapper
    be = object.__new__(fi.FlashInferAttnBackend)
    be.dispatch_reason, be.num_wrappers, be.prefill_backend, be.skip_prefill = None, 1, "fa2", False
    be.workspace_buffer, be.indices_updater_prefill = None, up
    be.kv_indptr, be.kv_last_page_len = up.kv_indptr, up.kv_last_page_len
    be.cuda_graph_qo_indptr = [on_device([0] * (MAX_BS + 1))]
    be.cuda_graph_kv_indices = [on_device([0] * (MAX_BS * POOL))]
    be.draft_extend_cuda_graph_metadata, be.prefill_cuda_graph_metadata = {}, {}
    be.is_multimodal = be.enable_mis = be.enable_deterministic = False
    be.use_paged, be.prefill_wrappers_paged, be.prefill_split_tile_size = True, [EagerWrapper()], None
    return be


def captured(fi, bs=4):
    req_to_token = torch.arange(MAX_BS * POOL, dtype=torch.int32).reshape(MAX_BS, POOL) * 3 + 1
    be = make_backend(fi, req_to_token.as_subclass(OnDevice))
    fill = fi.FlashInferAttnBackend.get_cuda_graph_seq_len_fill_value(be)
    be.init_forward_metadata_capture_cuda_graph(
        bs=bs, num_tokens=bs * STRIDE, req_pool_indices=on_device(range(bs)), seq_lens=on_device([fill] * bs),
        encoder_lens=None, forward_mode=fi.ForwardMode.DRAFT_EXTEND_V2, spec_info=SimpleNamespace(),
    )  # fmt: skip
    return be, fill


def eager_plan(fi, be, req_pool_indices, seq_lens):
    """The release's eager DRAFT_EXTEND_V2 (paged): what it plans for the live batch."""
    seq_lens = torch.tensor(seq_lens)
    prefix = (seq_lens - STRIDE).tolist()
    batch = SimpleNamespace(
        forward_mode=fi.ForwardMode.DRAFT_EXTEND_V2, req_pool_indices=on_device(req_pool_indices),
        seq_lens=on_device(seq_lens), seq_lens_cpu=seq_lens.int(), seq_lens_sum=int(seq_lens.sum()),
        extend_prefix_lens=on_device(prefix), extend_prefix_lens_cpu=prefix, encoder_lens=None,
        cross_attention_custom_mask=None, spec_info=None, batch_size=len(prefix),
    )  # fmt: skip
    be.init_forward_metadata(batch)
    return be.prefill_wrappers_paged[0].plans[-1]


def replay(fi, be, bs, fill, live_pool, live_lens, mirror=True, stale=0):
    pool = list(live_pool) + [0] * (bs - len(live_pool))  # the runner's padded buffers
    lens = list(live_lens) + [fill] * (bs - len(live_lens))
    seq_lens_cpu = torch.tensor(lens, dtype=torch.int32)
    be.init_forward_metadata_replay_cuda_graph(
        bs=bs, req_pool_indices=on_device(pool), seq_lens=on_device(lens), seq_lens_sum=sum(lens) + stale,
        encoder_lens=None, forward_mode=fi.ForwardMode.DRAFT_EXTEND_V2,
        spec_info=SimpleNamespace(num_tokens_per_req=STRIDE), seq_lens_cpu=seq_lens_cpu if mirror else None,
    )  # fmt: skip
    return lens


def test_capture_stores_a_graph_prefill_and_installs_the_sync_free_plan(fi):
    be, _ = captured(fi)
    (wrapper,) = be.draft_extend_cuda_graph_metadata[4]
    assert be.forward_metadata == fi.PrefillMetadata([wrapper], False, False)
    assert wrapper.begin_forward.func is importlib.import_module(RUNTIME).sync_free_plan
    qo, kv, kv_lens = wrapper._cached_module.calls[0][3:6]
    assert plain(qo).tolist() == [0, 4, 8, 12, 16]  # the graph's fixed width at capture, fill-value lengths
    assert plain(kv).tolist() == [0, 1, 2, 3, 4] and plain(kv_lens).tolist() == [1] * 4


def test_a_padded_replay_plans_what_the_eager_path_plans_without_reading_the_device(fi):
    be, fill = captured(fi)
    (wrapper,) = be.draft_extend_cuda_graph_metadata[4]
    stock_before = wrapper.stock_plans
    OnDevice.reads.clear()
    lens = replay(fi, be, 4, fill, [5, 2, 7], [13, 6, 9])  # 3 requests in the graph of 4
    assert OnDevice.reads == []  # no .to("cpu"), .item(), int() of a device tensor
    assert wrapper.stock_plans == stock_before  # plan() itself never ran
    module_args = wrapper._cached_module.calls[-1]
    qo, kv, kv_lens = (plain(a).tolist() for a in module_args[3:6])
    assert qo == [0, 4, 8, 12, 16] and kv == [0, 13, 19, 28, 29] and kv_lens == lens
    assert module_args[6:] == (16, 4, 8, 2, 1, True, 64, 64, False, -1, -1, False, 0)
    # The graph buffers hold the device's own numbers (the updater's), padded row included.
    assert plain(wrapper._paged_kv_indptr_buf).tolist() == plain(be.kv_indptr[0][:5]).tolist() == kv
    assert plain(wrapper._qo_indptr_buf).tolist() == qo and plain(wrapper._kv_lens_buffer).tolist() == lens
    assert (wrapper._max_q_len, wrapper._max_kv_len, wrapper._qo_indptr_last) == (4, 13, 16)
    # The eager path for the live batch plans the same arrays.
    eqo, ekv, eindices, _ = eager_plan(fi, be, [5, 2, 7], [13, 6, 9])
    assert eqo.tolist() == qo[:4] and ekv.tolist() == kv[:4]
    assert plain(wrapper._paged_kv_indices_buf)[:28].tolist() == eindices[:28].tolist()


def test_the_sync_free_plan_gives_what_plan_gives(fi):
    """One graph replayed twice for the same batch: once through the sync-free
    plan, once (a stale mirror) through the stock plan(): same module inputs,
    same plan info, same buffers."""
    be, fill = captured(fi)
    (wrapper,) = be.draft_extend_cuda_graph_metadata[4]
    replay(fi, be, 4, fill, [1, 3], [8, 11])
    fast = (wrapper._plan_info, [plain(a) for a in wrapper._cached_module.calls[-1][3:6]])
    buffers = [
        plain(b).clone() for b in (wrapper._qo_indptr_buf, wrapper._paged_kv_indptr_buf, wrapper._kv_lens_buffer)
    ]
    stock_before = wrapper.stock_plans
    OnDevice.reads.clear()
    replay(fi, be, 4, fill, [1, 3], [8, 11], stale=1)  # the mirror's sum disagrees: the stock plan
    assert wrapper.stock_plans == stock_before + 1 and OnDevice.reads  # plan() read the device, as pristine's
    stock = (wrapper._plan_info, [plain(a) for a in wrapper._cached_module.calls[-1][3:6]])
    assert fast[0] == stock[0] and all(torch.equal(a, b) for a, b in zip(fast[1], stock[1]))
    again = [plain(b) for b in (wrapper._qo_indptr_buf, wrapper._paged_kv_indptr_buf, wrapper._kv_lens_buffer)]
    assert all(torch.equal(a, b) for a, b in zip(buffers, again))


def test_without_the_mirror_the_stock_plan_runs(fi):
    be, fill = captured(fi)
    (wrapper,) = be.draft_extend_cuda_graph_metadata[4]
    stock_before = wrapper.stock_plans
    replay(fi, be, 4, fill, [0, 1, 2, 3], [5, 6, 7, 8], mirror=False)
    assert wrapper.stock_plans == stock_before + 1
    assert plain(wrapper._paged_kv_indptr_buf).tolist() == [0, 5, 11, 18, 26]
    assert wrapper.patchkit_host_plan is None  # the host plan is not left behind


def test_a_module_that_disagrees_keeps_the_stock_plan(fi, monkeypatch):
    """At capture, the sync-free plan is installed only if it reproduces plan()'s
    plan info (a FlashInfer whose module takes other arguments keeps plan())."""
    calls = itertools.count()
    monkeypatch.setattr(FakeModule, "plan", lambda self, *args: [len(args), next(calls)])  # never the same twice
    be, _ = captured(fi)
    (wrapper,) = be.draft_extend_cuda_graph_metadata[4]
    assert not hasattr(wrapper.begin_forward, "func")  # the wrapper's own plan()


@pytest.mark.parametrize("switch, dispatch, admitted", [(None, None, False), ("1", None, True), ("1", "swa", False)])
def test_the_worker_admits_flashinfer_only_when_switched_on(fi, monkeypatch, switch, dispatch, admitted):
    admits = importlib.import_module(RUNTIME).admits_flashinfer_draft_extend
    monkeypatch.delenv(SWITCH, raising=False)
    if switch:
        monkeypatch.setenv(SWITCH, switch)
    be = object.__new__(fi.FlashInferAttnBackend)
    be.dispatch_reason, be.skip_prefill = dispatch, False
    assert admits(be) is admitted
    assert admits(object()) is False
