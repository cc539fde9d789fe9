"""flashmla-spec-v2 on CPU: the patched ``flashmla_backend`` of 0.5.12.post1 and
0.5.15 (the two shapes of the file) imported for real, backends built by their
real ``__init__`` (the FlashInfer MLA parent's, which builds FlashInfer
wrappers, replaced by what FlashMLA reads from it); the Triton block-table
writer, ``get_mla_metadata`` and the FlashMLA kernel replaced by recorders.

* both FlashMLA classes opt out; the decision for an all-FlashMLA spec-v2 run
  is "no mirror";
* every read FlashMLA makes of the mirror on the spec paths (draft decode,
  target verify, draft extend; eager and CUDA-graph replay) works with None,
  makes no host read at all (``Tensor.item`` raises), and gives the old,
  tight value with the mirror;
* block tables without the mirror cover the static bound and stay within the
  preallocated CUDA-graph table;
* the draft extend runs on the fixed-q kernel with its own K lengths, never
  on the FlashInfer MLA parent;
* the verify tree mask: allocated on the target backend only, worst-case size,
  handed to the worker.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace as NS
from unittest import mock

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402
from patchkit.tree import find_tree  # noqa: E402

PATCH = "flashmla-spec-v2"
MODULE = "sglang.srt.layers.attention.flashmla_backend"
PAGE = 64  # FlashMLA's PAGE_SIZE
CTX = 256  # max_context_len
NUM_DRAFT = 4
HEADS = 16
MAX_BS = 4
SM_PARTS = 8
REQ_TO_TOKEN = torch.arange(8 * (CTX + PAGE), dtype=torch.int32).reshape(8, CTX + PAGE) + 1000
SEQ_LENS = torch.tensor([70, 9])  # two pages, one page
POOL = torch.tensor([3, 1])


def cdiv(a, b):
    return -(-a // b)


@pytest.fixture(scope="module", params=["0.5.12.post1", "0.5.15"])
def sglang(request, tmp_path_factory, load_sglang):
    package = copy_tree(request.param, tmp_path_factory.mktemp(f"flashmla-{request.param}"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PATCH], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture
def fm(sglang):
    module = importlib.import_module(MODULE)
    assert module.__file__.startswith(str(sglang.__path__[0]))
    return module


@pytest.fixture
def decide(sglang):
    """The decision of the tree: needs-cpu-seq-lens' runtime (vendored), or
    upstream's own from 0.5.13 (FutureMap's)."""
    try:
        return importlib.import_module("sglang.srt._patchkit.runtime").decide_needs_cpu_seq_lens
    except ModuleNotFoundError:
        return importlib.import_module("sglang.srt.managers.overlap_utils").decide_needs_cpu_seq_lens


@pytest.fixture
def modes(sglang):
    return importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode


# --- stand-ins ---------------------------------------------------------------------------


def model_runner(num_draft=NUM_DRAFT, is_draft_worker=False):
    config = NS(
        num_attention_heads=HEADS,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=512,
        scaling=0.1,
    )
    return NS(
        model_config=config,
        kv_cache_dtype=torch.bfloat16,
        dtype=torch.bfloat16,
        device="cpu",
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN, size=8),
        server_args=NS(speculative_num_draft_tokens=num_draft),
        is_draft_worker=is_draft_worker,
    )


def parent_init(self, model_runner, skip_prefill=False, *args, **kwargs):
    """What FlashMLABackend reads from FlashInferMLAAttnBackend.__init__."""
    self.max_context_len = CTX
    self.device = torch.device("cpu")
    self.skip_prefill = skip_prefill
    self.token_to_kv_pool = NS(get_key_buffer=lambda layer_id: torch.zeros(8 * PAGE, 1, 576))


class CpuTorch:
    """The module's ``torch``, with the graph buffers it hard-codes on "cuda" made on the CPU."""

    cuda = NS(get_device_properties=lambda device: NS(multi_processor_count=SM_PARTS))

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def full(*args, device=None, **kwargs):
        return torch.full(*args, **kwargs)

    @staticmethod
    def empty(*args, device=None, **kwargs):
        return torch.empty(*args, **kwargs)

    @staticmethod
    def ones(*args, device=None, **kwargs):
        return torch.ones(*args, **kwargs)


class Kernels:
    """Recorders for the GPU kernels FlashMLA launches."""

    def __init__(self):
        self.tables, self.metadata, self.attention = [], [], []

    def kv_indices_writer(self, grid):
        def launch(req_to_token, pool, lens, start, table, req_stride, table_stride):
            assert start is None and table_stride == table.stride(0)
            for row, (p, n) in enumerate(zip(pool.tolist(), lens.tolist())):
                pages = cdiv(n, PAGE)
                assert pages <= table.shape[1], (pages, table.shape)  # the real kernel would write past the row
                table[row, :pages] = req_to_token[p, 0 : pages * PAGE : PAGE] // PAGE
            self.tables.append(table)

        return launch

    def get_mla_metadata(self, seq_lens, q_heads, k_heads, is_fp8_kvcache=False):
        self.metadata.append((seq_lens.tolist(), q_heads))
        return torch.zeros(SM_PARTS, 8, dtype=torch.int32), torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, **kwargs):
        self.attention.append((tuple(q.shape), cache_seqlens.tolist()))
        return torch.zeros(*q.shape[:3], head_dim_v), None


@pytest.fixture
def kernels(fm):
    k = Kernels()
    writer = type("Writer", (), {"__getitem__": lambda self, grid: k.kv_indices_writer(grid)})()
    patches = [
        mock.patch.object(fm, "create_flashmla_kv_indices_triton", writer),
        mock.patch.object(fm, "get_mla_metadata", k.get_mla_metadata),
        mock.patch.object(fm, "flash_mla_with_kvcache", k.flash_mla_with_kvcache),
        mock.patch.object(fm.FlashInferMLAAttnBackend, "init_forward_metadata", _never("the parent's metadata")),
        mock.patch.object(fm.FlashInferMLAAttnBackend, "forward_extend", _never("the parent's prefill")),
    ]
    for p in patches:
        p.start()
    yield k
    for p in reversed(patches):
        p.stop()


def _never(what):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} ran")

    return called


@pytest.fixture
def no_host_reads(monkeypatch):
    """While active, any ``Tensor.item()`` (a D2H on a GPU) fails."""

    def item(self):
        raise AssertionError("host read (Tensor.item) on a path that must be sync-free")

    return lambda: monkeypatch.setattr(torch.Tensor, "item", item)


def built(fm, runner):
    """FlashMLA's __init__ with what it reads from its parent and the parallel state stood in."""
    names = {
        "get_attention_tp_size": lambda: 1,
        "get_parallel": lambda: NS(attn_tp_size=1),
        "get_attention_dcp_world_size": lambda: 1,
        "get_attention_dcp_rank": lambda: 0,
    }
    with (
        mock.patch.object(fm.FlashInferMLAAttnBackend, "__init__", parent_init),
        mock.patch.multiple(fm, **{n: f for n, f in names.items() if hasattr(fm, n)}),
    ):
        return runner()


def backend(fm, skip_prefill=False, **kwargs):
    return built(fm, lambda: fm.FlashMLABackend(model_runner(**kwargs), skip_prefill=skip_prefill))


def draft_wrapper(fm, steps=3):
    return built(fm, lambda: fm.FlashMLAMultiStepDraftBackend(model_runner(is_draft_worker=True), 1, steps))


def with_graph_state(fm, b):
    with mock.patch.object(fm, "torch", CpuTorch()):
        b.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    return b


def batch(modes, mode, mirror=True, seq_lens=SEQ_LENS, **extra):
    fields = dict(
        forward_mode=mode,
        batch_size=2,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone() if mirror else None,
        seq_lens_sum=int(seq_lens.sum()) if mirror else None,
        req_pool_indices=POOL,
        spec_info=NS(),
        out_cache_loc=None,
        token_to_kv_pool=NS(get_key_buffer=lambda layer_id: torch.zeros(8 * PAGE, 1, 576)),
    )
    fields.update(extra)
    return NS(**fields)


def rows_match(table, lens):
    for row, (p, n) in enumerate(zip(POOL.tolist(), lens)):
        pages = cdiv(n, PAGE)
        assert table[row, :pages].tolist() == (REQ_TO_TOKEN[p, 0 : pages * PAGE : PAGE] // PAGE).tolist()


# --- flags and the decision ------------------------------------------------------------------


def test_both_classes_opt_out(fm):
    assert fm.FlashMLABackend.needs_cpu_seq_lens is False
    assert fm.FlashMLAMultiStepDraftBackend.needs_cpu_seq_lens is False


def test_decision_for_an_all_flashmla_spec_v2_run(fm, decide):
    """EAGLEWorkerV2's backends: target, draft wrapper, draft-extend backend
    (None: FlashMLA has none before 0.5.16) and the draft runner's own, which
    runs the draft extend."""
    target, draft, draft_runner = backend(fm), draft_wrapper(fm), backend(fm, is_draft_worker=True)
    args = NS(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=True, speculative_algorithm="EAGLE")
    assert decide(args, [target, draft, None, draft_runner]) is False
    assert all(step.needs_cpu_seq_lens is False for step in draft.attn_backends)


# --- eager metadata --------------------------------------------------------------------------


@pytest.mark.parametrize("mirror", [True, False])
def test_eager_draft_decode(fm, modes, kernels, no_host_reads, mirror):
    b = backend(fm, skip_prefill=True)
    fb = batch(modes, modes.DECODE, mirror)
    if not mirror:
        no_host_reads()
    b.init_forward_metadata(fb)
    table = b.forward_metadata.block_kv_indices
    # The mirror's max (70: two pages), else the static bound (256: four pages).
    assert table.shape == (2, 2 if mirror else cdiv(CTX, PAGE))
    rows_match(table, SEQ_LENS.tolist())
    assert kernels.metadata == [(SEQ_LENS.tolist(), HEADS)]


@pytest.mark.parametrize("mirror", [True, False])
def test_eager_target_verify(fm, modes, kernels, no_host_reads, mirror):
    b = backend(fm)
    fb = batch(modes, modes.TARGET_VERIFY, mirror)
    if not mirror:
        no_host_reads()
    b.init_forward_metadata(fb)
    verify_lens = (SEQ_LENS + NUM_DRAFT).tolist()
    assert b.forward_metadata.block_kv_indices.shape == (2, 2 if mirror else cdiv(CTX + NUM_DRAFT, PAGE))
    rows_match(b.forward_metadata.block_kv_indices, verify_lens)
    assert kernels.metadata == [(verify_lens, NUM_DRAFT * HEADS)]


@pytest.mark.parametrize("mirror", [True, False])
def test_eager_draft_extend_runs_on_flashmla_from_device_lengths(fm, modes, kernels, no_host_reads, mirror):
    """The spec-v2 draft extend (the draft runner's own backend): seq_lens
    already hold the window of draft tokens; no host list, no mirror needed,
    never the FlashInfer MLA parent."""
    b = backend(fm, is_draft_worker=True)
    fb = batch(
        modes,
        modes.DRAFT_EXTEND_V2,
        mirror,
        extend_seq_lens=torch.full((2,), NUM_DRAFT),
        extend_prefix_lens_cpu=None,
        extend_seq_lens_cpu=None,
    )
    if not mirror:
        no_host_reads()
    b.init_forward_metadata(fb)
    md = b.forward_metadata
    assert md.seq_lens_k.dtype == torch.int32 and md.seq_lens_k.tolist() == SEQ_LENS.tolist()
    assert md.block_kv_indices.shape == (2, cdiv((70 if mirror else CTX) + NUM_DRAFT, PAGE))
    rows_match(md.block_kv_indices, SEQ_LENS.tolist())
    assert kernels.metadata == [(SEQ_LENS.tolist(), NUM_DRAFT * HEADS)]


def test_draft_extend_k_lengths_pad_a_short_window(fm):
    from sglang.srt._patchkit.backends import flashmla

    k = flashmla.draft_extend_seq_lens_k(torch.tensor([10, 20]), torch.tensor([4, 2]), 4)
    assert k.tolist() == [10, 22] and k.dtype == torch.int32


# --- forward_extend: the fixed-q kernel ------------------------------------------------------

LAYER = NS(tp_q_head_num=HEADS, head_dim=576, v_head_dim=512, layer_id=0, k_scale=None, scaling=0.1)


@pytest.mark.parametrize("mode, k_lens", [("DRAFT_EXTEND_V2", [70, 9]), ("TARGET_VERIFY", [74, 13])])
def test_forward_extend_fixed_q_lengths(fm, modes, kernels, no_host_reads, mode, k_lens):
    b = backend(fm)
    fb = batch(modes, getattr(modes, mode), mirror=False, extend_seq_lens=torch.full((2,), NUM_DRAFT))
    no_host_reads()
    b.init_forward_metadata(fb)
    q = torch.zeros(2 * NUM_DRAFT, HEADS * 576)
    out = b.forward_extend(q, None, None, LAYER, fb, save_kv_cache=False)
    assert out.shape == (2 * NUM_DRAFT, HEADS * 512)
    assert kernels.attention == [((2, NUM_DRAFT, HEADS, 576), k_lens)]


# --- CUDA-graph replay -----------------------------------------------------------------------


def replayed(fm, b, modes, mode, seq_lens_cpu):
    """Capture (as the graph runner does, with the fill value) and replay."""
    ones = torch.ones(2, dtype=torch.int64)
    fb = batch(modes, mode, seq_lens=ones)
    if hasattr(b, "init_forward_metadata_capture_cuda_graph") and "init_forward_metadata_capture_cuda_graph" in vars(
        type(b)
    ):
        b.init_forward_metadata_capture_cuda_graph(2, 2, torch.zeros(2, dtype=torch.int64), ones, None, mode, NS())
        return lambda: b.init_forward_metadata_replay_cuda_graph(
            2, POOL, SEQ_LENS, None, None, mode, NS(), seq_lens_cpu
        )
    b.init_forward_metadata_out_graph(fb, in_capture=True)  # 0.5.13+
    return lambda: b.init_forward_metadata_out_graph(batch(modes, mode, seq_lens_cpu is not None))


@pytest.mark.parametrize("mode", ["DECODE", "TARGET_VERIFY"])
@pytest.mark.parametrize("mirror", [True, False])
def test_replay(fm, modes, kernels, no_host_reads, mode, mirror):
    mode = getattr(modes, mode)
    b = with_graph_state(fm, backend(fm, skip_prefill=mode == modes.DECODE))
    table = b.cuda_graph_kv_indices
    assert table.shape == (MAX_BS, (CTX + PAGE) // PAGE)
    run = replayed(fm, b, modes, mode, SEQ_LENS.clone() if mirror else None)
    table.fill_(-1)
    if not mirror:
        no_host_reads()  # 0.5.15 fell back to seq_lens.max().item() here
    run()
    lens = (SEQ_LENS + (NUM_DRAFT if mode == modes.TARGET_VERIFY else 0)).tolist()
    rows_match(table, lens)
    width = b.forward_metadata.block_kv_indices.shape[1]
    assert width == (cdiv(max(lens), PAGE) if mirror else cdiv(CTX, PAGE))
    assert width <= table.shape[1]


def test_draft_wrapper_replay_without_the_mirror(fm, modes, kernels, no_host_reads):
    draft = draft_wrapper(fm)
    with mock.patch.object(fm, "torch", CpuTorch()):
        draft.init_cuda_graph_state(MAX_BS, MAX_BS)
    fb = batch(modes, modes.DECODE, mirror=False, spec_info=NS(is_draft_input=lambda: True))
    capture = NS(
        **{**vars(fb), "seq_lens": torch.ones(2, dtype=torch.int64), "seq_lens_cpu": torch.ones(2, dtype=torch.int64)}
    )
    if hasattr(draft, "init_forward_metadata_capture_cuda_graph"):
        draft.init_forward_metadata_capture_cuda_graph(capture)
        no_host_reads()
        draft.init_forward_metadata_replay_cuda_graph(fb, 2)
    else:  # 0.5.13+
        draft.init_forward_metadata_out_graph(capture, in_capture=True)
        no_host_reads()
        draft.init_forward_metadata_out_graph(fb)
    for step in draft.attn_backends:
        rows_match(step.cuda_graph_kv_indices, SEQ_LENS.tolist())


# --- the verify tree mask --------------------------------------------------------------------


def test_target_backend_preallocates_the_worst_case_mask(fm):
    b = backend(fm)
    assert b.cuda_graph_custom_mask is None and b.get_verify_buffers_to_fill_after_draft() == [None, None]
    with_graph_state(fm, b)
    mask = b.cuda_graph_custom_mask
    # FlashMLA's verify never reads it: the compact QLEN_ONLY layout (sglang #32920), D x D cells a request.
    assert mask.dtype == torch.bool and mask.shape == (MAX_BS * NUM_DRAFT * NUM_DRAFT,) and not mask.any()
    buffers = b.get_verify_buffers_to_fill_after_draft()
    assert buffers[0] is mask and buffers[1] is None


@pytest.mark.parametrize("kwargs", [dict(is_draft_worker=True), dict(skip_prefill=True), dict(num_draft=None)])
def test_no_mask_off_the_target(fm, kwargs):
    b = with_graph_state(fm, backend(fm, **kwargs))
    assert b.cuda_graph_custom_mask is None


def test_worker_sizes_nothing_from_seq_lens_sum_with_the_mask(fm, sglang):
    """0.5.10 .. 0.5.12.post1: needs-cpu-seq-lens' guard in the worker's draft
    step uses the mask as is. 0.5.13+: the worker is upstream's own, so the
    tree carries no scheduler runtime of ours (nothing of ours sizes the mask)."""
    if find_tree(sglang.__path__[0]).version != "0.5.12.post1":  # 0.5.15: the worker is upstream's
        assert importlib.util.find_spec("sglang.srt._patchkit.runtime") is None
        return
    rt = importlib.import_module("sglang.srt._patchkit.runtime")
    target = with_graph_state(fm, backend(fm))
    mask, _ = target.get_verify_buffers_to_fill_after_draft()
    assert rt.tree_mask_seq_lens_sum(None, mask, SEQ_LENS, target) == 0
    assert rt.tree_mask_seq_lens_sum(41, mask, SEQ_LENS, target) == 41
