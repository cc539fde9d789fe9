"""fa3-spec-v2 on CPU: the patched 0.5.12.post1 ``flashattention_backend``
imported for real, backends built by their real ``__init__`` from a stand-in
model runner (``sgl_kernel`` is the stub, so nothing reaches a GPU kernel; the
one Triton page-table writer of the draft-decode replay is replaced by a
recorder).

* both FA3 classes opt out, and the decision for an all-FA3 spec-v2 run is
  "no mirror" (with another backend beside it, or TBO, it stays "mirror");
* every read FA3 makes of the mirror on the spec paths (draft decode, target
  verify, draft extend; eager and CUDA-graph replay) works with None and gives
  the old, tight value with the mirror;
* page tables without the mirror cover the static bound and never pass the
  preallocated table;
* the verify tree mask: allocated on the target backend only, worst-case size,
  handed to the worker, which then sizes nothing from seq_lens_sum.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSION = "0.5.12.post1"
PATCH = "fa3-spec-v2"
CTX = 64  # max_context_len
EXTRA = 4  # req_to_token is a little wider than the context, as in sglang
NUM_DRAFT = 4
MAX_BS = 4


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    """The patched tree (fa3-spec-v2 and needs-cpu-seq-lens it requires), imported on CPU."""
    package = copy_tree(VERSION, tmp_path_factory.mktemp("fa3"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PATCH], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture(scope="module")
def fa(sglang):
    module = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    assert module.__file__.startswith(str(sglang.__path__[0]))
    return module


@pytest.fixture(scope="module")
def rt(sglang):
    """The runtime vendored into the patched tree (patchkit itself is unimportable here)."""
    return importlib.import_module("sglang.srt._patchkit.runtime")


@pytest.fixture(scope="module")
def modes(sglang):
    return importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode


REQ_TO_TOKEN = torch.arange(8 * (CTX + EXTRA), dtype=torch.int32).reshape(8, CTX + EXTRA) + 1000


def model_runner(num_draft=NUM_DRAFT, topk=1, is_draft_worker=False):
    config = NS(
        is_encoder_decoder=False,
        context_len=CTX,
        attention_arch=None,
        is_local_attention_model=False,
        head_dim=64,
        hf_text_config=NS(num_attention_heads=8),
        get_num_kv_heads=lambda tp: 2,
    )
    server_args = NS(
        kv_cache_dtype="auto",
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=num_draft,
        enable_deterministic_inference=False,
        disable_cuda_graph=False,
        is_embedding=False,
        chunked_prefill_size=8192,
        disable_radix_cache=False,
        enable_dp_attention=False,
    )
    return NS(
        sliding_window_size=None,
        model_config=config,
        device="cpu",
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        kv_cache_dtype=torch.bfloat16,
        server_args=server_args,
        page_size=1,
        attn_cp_size=1,
        token_to_kv_pool=object(),
        tp_size=1,
        is_draft_worker=is_draft_worker,
    )


def backend(fa, **kwargs):
    init = {k: kwargs.pop(k) for k in ("skip_prefill", "speculative_step_id", "speculative_num_steps") if k in kwargs}
    return fa.FlashAttentionBackend(model_runner(**kwargs), **init)


SEQ_LENS = torch.tensor([5, 9])
POOL = torch.tensor([3, 1])


def batch(modes, mode, mirror=True, **extra):
    fields = dict(
        forward_mode=mode,
        batch_size=2,
        seq_lens=SEQ_LENS,
        seq_lens_cpu=SEQ_LENS.clone() if mirror else None,
        req_pool_indices=POOL,
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        spec_info=NS(),
        encoder_lens=None,
        out_cache_loc=None,
    )
    fields.update(extra)
    return NS(**fields)


def rows_match_req_to_token(table, lens):
    """Each row starts with the request's token slots up to its length."""
    for row, (pool, n) in enumerate(zip(POOL.tolist(), lens)):
        assert table[row, :n].tolist() == REQ_TO_TOKEN[pool, :n].tolist()


# --- flags and the decision ------------------------------------------------------------------


def test_both_classes_opt_out(fa):
    assert fa.FlashAttentionBackend.needs_cpu_seq_lens is False
    assert fa.FlashAttentionMultiStepBackend.needs_cpu_seq_lens is False
    assert backend(fa).needs_cpu_seq_lens is False


def test_decision_for_an_all_fa3_spec_v2_run(fa, rt, sglang):
    target = backend(fa)
    draft = fa.FlashAttentionMultiStepBackend(model_runner(is_draft_worker=True), topk=1, speculative_num_steps=3)
    draft_extend = backend(fa, is_draft_worker=True)
    args = lambda **kw: NS(**{"enable_two_batch_overlap": False, "disable_piecewise_cuda_graph": True, **kw})  # noqa: E731
    assert rt.decide_needs_cpu_seq_lens(args(), [target, draft, draft_extend, None]) is False
    assert rt.decide_needs_cpu_seq_lens(args(enable_two_batch_overlap=True), [target, draft]) is True
    assert rt.decide_needs_cpu_seq_lens(args(disable_piecewise_cuda_graph=False), [target, draft]) is True
    flashinfer = importlib.import_module("sglang.srt.layers.attention.flashinfer_backend").FlashInferAttnBackend
    assert rt.decide_needs_cpu_seq_lens(args(), [target, object.__new__(flashinfer)]) is True


def test_draft_wrapper_steps_never_verify(fa):
    """The wrapper builds its step backends without skip_prefill, on the draft
    worker's model runner: is_draft_runner is what keeps the mask off them
    (sglang #31527)."""
    draft = fa.FlashAttentionMultiStepBackend(model_runner(is_draft_worker=True), topk=1, speculative_num_steps=3)
    for step in draft.attn_backends:
        step.init_cuda_graph_state(MAX_BS, MAX_BS)
        assert step.cuda_graph_custom_mask is None and step.needs_cpu_seq_lens is False


# --- eager metadata --------------------------------------------------------------------------


@pytest.mark.parametrize("mirror", [True, False])
def test_eager_draft_decode(fa, modes, mirror):
    b = backend(fa, speculative_step_id=1, speculative_num_steps=3)
    b.init_forward_metadata(batch(modes, modes.DECODE, mirror))
    md = b.forward_metadata
    assert md.cache_seqlens_int32.tolist() == [5 + 2, 9 + 2]
    # Width: the mirror's max plus the step's tokens; else the static bound
    # (clipped by req_to_token's own width).
    assert md.page_table.shape == (2, 9 + 2 if mirror else CTX + 2)
    rows_match_req_to_token(md.page_table, [7, 11])


@pytest.mark.parametrize("mirror", [True, False])
def test_eager_target_verify(fa, modes, mirror):
    b = backend(fa)
    b.init_forward_metadata(batch(modes, modes.TARGET_VERIFY, mirror))
    md = b.forward_metadata
    assert md.cache_seqlens_int32.tolist() == [5 + NUM_DRAFT, 9 + NUM_DRAFT]
    assert md.max_seq_len_q == NUM_DRAFT
    assert md.page_table.shape == (2, 9 + NUM_DRAFT if mirror else CTX + EXTRA)
    rows_match_req_to_token(md.page_table, [9, 13])


@pytest.mark.parametrize("host_lists", [True, False])
def test_eager_draft_extend_v2_without_the_mirror(fa, modes, host_lists):
    """The GPU-only draft extend: no mirror, prefix lengths a device tensor
    (host list unset), the extend host list given or not."""
    b = backend(fa, is_draft_worker=True)
    extend = torch.full((2,), NUM_DRAFT, dtype=torch.int32)
    fb = batch(
        modes,
        modes.DRAFT_EXTEND_V2,
        mirror=False,
        extend_seq_lens=extend,
        extend_prefix_lens_cpu=None,
        extend_seq_lens_cpu=[NUM_DRAFT, NUM_DRAFT] if host_lists else None,
    )
    b.init_forward_metadata(fb)
    md = b.forward_metadata
    assert md.max_seq_len_q == NUM_DRAFT
    assert md.cu_seqlens_q.tolist() == [0, NUM_DRAFT, 2 * NUM_DRAFT]
    assert md.page_table.shape == (2, CTX)
    rows_match_req_to_token(md.page_table, SEQ_LENS.tolist())


def test_eager_prefill_extend_is_unchanged(fa, modes):
    b = backend(fa)
    fb = batch(
        modes,
        modes.EXTEND,
        extend_seq_lens=SEQ_LENS.to(torch.int32),
        extend_prefix_lens_cpu=[0, 0],
        extend_seq_lens_cpu=[5, 9],
    )
    b.init_forward_metadata(fb)
    md = b.forward_metadata
    assert md.max_seq_len_k == 9 and md.max_seq_len_q == 9 and md.page_table.shape == (2, 9)


# --- CUDA-graph replay -----------------------------------------------------------------------


def captured(fa, modes, mode, **kwargs):
    b = backend(fa, **kwargs)
    b.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    num_tokens = 2 * (NUM_DRAFT if mode == modes.TARGET_VERIFY else 1)
    b.init_forward_metadata_capture_cuda_graph(
        2, num_tokens, torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), None, mode, NS()
    )
    return b


def replay(b, mode, seq_lens_cpu, seq_lens=SEQ_LENS):
    b.init_forward_metadata_replay_cuda_graph(2, POOL, seq_lens, None, None, mode, NS(), seq_lens_cpu=seq_lens_cpu)


def rows_to_their_length(table, lens):
    """Each row holds the request's token slots up to its own length and
    nothing was written past it (the -1 an earlier batch left)."""
    rows_match_req_to_token(table, lens)
    for row, n in enumerate(lens):
        assert (table[row, n:] == -1).all(), row


def test_replay_target_verify_without_the_mirror_builds_each_row_to_its_length(fa, modes):
    b = captured(fa, modes, modes.TARGET_VERIFY)
    md = b.target_verify_metadata[2]
    md.page_table.fill_(-1)  # what earlier batches left
    replay(b, modes.TARGET_VERIFY, None)
    assert md.cache_seqlens_int32.tolist() == [5 + NUM_DRAFT, 9 + NUM_DRAFT]
    assert md.cu_seqlens_k.tolist() == [0, 9, 22]
    # On the device from cache_seqlens (before: the whole static width).
    rows_to_their_length(md.page_table, [5 + NUM_DRAFT, 9 + NUM_DRAFT])


def test_replay_target_verify_with_the_mirror_is_tight(fa, modes):
    b = captured(fa, modes, modes.TARGET_VERIFY)
    md = b.target_verify_metadata[2]
    md.page_table.fill_(-1)
    replay(b, modes.TARGET_VERIFY, SEQ_LENS.clone())
    width = 9 + NUM_DRAFT
    assert md.max_seq_len_k == width
    rows_to_their_length(md.page_table, [5 + NUM_DRAFT, 9 + NUM_DRAFT])  # only what is read


def test_replay_with_a_stale_mirror_still_builds_the_live_columns(fa, modes):
    """A stale pinned mirror (lengths of an earlier, shorter batch) used to
    size the refresh too small, so the kernel read stale page ids (why the
    runners pass None: replay-no-stale-mirror). The table now comes from the
    device cache_seqlens: the mirror no longer sizes it."""
    b = captured(fa, modes, modes.TARGET_VERIFY)
    md = b.target_verify_metadata[2]
    md.page_table.fill_(-1)
    replay(b, modes.TARGET_VERIFY, torch.tensor([1, 1]))  # a stale pinned buffer
    rows_to_their_length(md.page_table, [5 + NUM_DRAFT, 9 + NUM_DRAFT])


@pytest.fixture
def page_writer(fa, monkeypatch):
    """The fused Triton page-table writer, replaced by a recorder that checks
    what the real kernel does not: the page count fits the table."""
    calls = []

    def record(
        cache_seqlens,
        cu_seqlens_k,
        page_table,
        req_to_token,
        req_pool_indices,
        strided,
        max_seq_pages,
        seq_lens,
        delta,
        page_size,
        swa_page_table=None,
        pool=None,
    ):
        assert max_seq_pages <= page_table.shape[1], (max_seq_pages, page_table.shape)
        calls.append(max_seq_pages)
        cache_seqlens.copy_(seq_lens + delta)
        page_table[:, :max_seq_pages].copy_(req_to_token[req_pool_indices[:, None], strided[None, :max_seq_pages]])

    monkeypatch.setattr(fa, "normal_decode_set_metadata", record)
    return calls


@pytest.mark.parametrize("mirror, pages", [(True, 9 + 2), (False, CTX)])
def test_replay_draft_decode_page_count_fits_the_table(fa, modes, page_writer, mirror, pages):
    b = captured(fa, modes, modes.DECODE, speculative_step_id=1, speculative_num_steps=3, skip_prefill=True)
    replay(b, modes.DECODE, SEQ_LENS.clone() if mirror else None)
    assert page_writer == [pages]
    md = b.decode_cuda_graph_metadata[2]
    rows_match_req_to_token(md.page_table, [7, 11])


def test_draft_wrapper_replay_without_the_mirror(fa, modes, page_writer):
    draft = fa.FlashAttentionMultiStepBackend(model_runner(is_draft_worker=True), topk=1, speculative_num_steps=3)
    draft.init_cuda_graph_state(MAX_BS, MAX_BS)
    fb = batch(modes, modes.DECODE, mirror=False, seq_lens_sum=None, spec_info=NS(is_draft_input=lambda: True))
    draft.init_forward_metadata_capture_cuda_graph(
        NS(
            **{
                **vars(fb),
                "seq_lens": torch.ones(2, dtype=torch.int64),
                "req_pool_indices": torch.zeros(2, dtype=torch.int64),
            }
        )
    )
    draft.init_forward_metadata_replay_cuda_graph(fb, 2)
    assert page_writer == [CTX] * (3 - 1)  # one per draft step backend, each within the table


# --- the verify tree mask --------------------------------------------------------------------


def test_target_backend_preallocates_the_worst_case_mask(fa):
    """Top-k 1 (this backend's): verify never reads the mask, so it is the
    compact QLEN_ONLY layout (sglang #32920): D x D cells a request."""
    b = backend(fa)
    assert b.cuda_graph_custom_mask is None and b.get_verify_buffers_to_fill_after_draft() == [None, None]
    b.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    mask = b.cuda_graph_custom_mask
    assert mask.dtype == torch.bool and mask.shape == (MAX_BS * NUM_DRAFT * NUM_DRAFT,)
    assert not mask.any()
    buffers = b.get_verify_buffers_to_fill_after_draft()
    assert buffers[0] is mask and buffers[1] is None


@pytest.mark.parametrize("kwargs", [dict(is_draft_worker=True), dict(skip_prefill=True), dict(num_draft=None)])
def test_no_mask_off_the_target(fa, kwargs):
    b = backend(fa, **kwargs)
    b.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    assert b.cuda_graph_custom_mask is None


def test_worker_sizes_nothing_from_seq_lens_sum_with_the_mask(fa, rt):
    """eagle_worker_v2's draft step hands build_tree_kernel_efficient
    tree_mask_seq_lens_sum(...): with FA3's mask, 0 (the buffer is used as is);
    without one (e.g. CUDA graphs off), the bs * max_context_len upper bound."""
    target = backend(fa)
    target.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    mask, _ = target.get_verify_buffers_to_fill_after_draft()
    assert rt.tree_mask_seq_lens_sum(None, mask, SEQ_LENS, target) == 0
    assert rt.tree_mask_seq_lens_sum(None, None, SEQ_LENS, target) == 2 * CTX
    assert rt.tree_mask_seq_lens_sum(14, mask, SEQ_LENS, target) == 14


# --- the tree mask the draft worker hands the tree kernel (issue 29 §3) ----------------------------
#
# The mask is sized at capture for max_bs requests; build_tree_kernel_efficient writes
# D * sum(seq_lens) + bs * D**2 cells into whatever it is handed, unchecked. The patched
# EagleDraftWorker.draft runs for real below, up to that kernel (recorded, then stopped).

CAPTURED_BS = 2


class _AtTheKernel(Exception):
    pass


@pytest.fixture(scope="module")
def worker(sglang):
    return importlib.import_module("sglang.srt.speculative.eagle_worker_v2")


def kernel_inputs(worker, monkeypatch, target, bs, mirror):
    """(tree_mask_buf, seq_lens_sum) the patched draft step hands
    build_tree_kernel_efficient for ``bs`` requests of the longest context."""
    seen = {}

    def kernel(*args):
        seen["args"] = args
        raise _AtTheKernel

    monkeypatch.setattr(worker, "build_tree_kernel_efficient", kernel)
    seq_lens = torch.full((bs,), CTX)
    not_idle = NS(is_idle=lambda: False)
    forward_batch = NS(forward_mode=not_idle)
    spec_info = NS(prepare_for_v2_draft=lambda *args: (forward_batch, False), bonus_tokens=torch.zeros(bs))
    model_worker_batch = NS(
        spec_info=spec_info,
        forward_mode=not_idle,
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()) if mirror else None,
    )
    draft_worker = NS(
        req_to_token_pool=None,
        cuda_graph_runner=None,
        draft_runner=None,
        topk=1,
        speculative_num_steps=1,
        draft_forward=lambda batch: (None, None, None),
        target_worker=NS(model_runner=NS(attn_backend=target)),
        speculative_num_draft_tokens=NUM_DRAFT,
        tree_mask_mode=None,
    )
    with pytest.raises(_AtTheKernel):
        worker.EagleDraftWorker.draft(draft_worker, model_worker_batch)
    args = seen["args"]
    return args[10], args[5]


def cells_written(bs):
    """What the FULL_MASK kernel writes for ``bs`` requests of CTX tokens."""
    return NUM_DRAFT * bs * CTX + bs * NUM_DRAFT * NUM_DRAFT


@pytest.mark.parametrize("mirror", [False, True])
def test_eager_batch_above_the_captured_size_never_gets_the_small_mask(fa, worker, monkeypatch, mirror):
    """D=4, C=64, captured max_bs=2, an eager batch of 3: the buffer handed over
    is None (then the kernel allocates from seq_lens_sum, which covers the
    batch) or large enough. Before the guard it was the 2-request mask (544
    cells) for 816 cells of writes."""
    target = backend(fa)
    target.init_cuda_graph_state(CAPTURED_BS, CAPTURED_BS * NUM_DRAFT)
    assert target.cuda_graph_custom_mask.numel() < cells_written(3)
    buf, seq_lens_sum = kernel_inputs(worker, monkeypatch, target, 3, mirror)
    if buf is not None:
        assert buf.numel() >= cells_written(3)
    else:
        assert seq_lens_sum * NUM_DRAFT + 3 * NUM_DRAFT * NUM_DRAFT >= cells_written(3)
    assert buf is None  # what the guard does: the batch gets a mask of its own
    assert seq_lens_sum == 3 * CTX  # the exact sum with the mirror, its bound without


@pytest.mark.parametrize("bs", [1, CAPTURED_BS])
def test_batches_within_the_captured_size_reuse_the_mask(fa, worker, monkeypatch, bs):
    target = backend(fa)
    target.init_cuda_graph_state(CAPTURED_BS, CAPTURED_BS * NUM_DRAFT)
    assert target.verify_tree_mask_max_bs == CAPTURED_BS
    buf, seq_lens_sum = kernel_inputs(worker, monkeypatch, target, bs, mirror=False)
    # Top-k 1: the compact QLEN_ONLY layout (sglang #32920), D x D cells a request.
    assert buf is target.cuda_graph_custom_mask and buf.numel() >= bs * NUM_DRAFT * NUM_DRAFT
    assert seq_lens_sum == 0  # ignored by the kernel with a buffer: no D2H


def test_no_cuda_graphs_no_mask(fa, worker, monkeypatch):
    buf, seq_lens_sum = kernel_inputs(worker, monkeypatch, backend(fa), 3, mirror=False)
    assert buf is None and seq_lens_sum == 3 * CTX
