"""trtllm-mha-spec-v2 (sglang #28106) on CPU: the fully patched 0.5.12.post1
``trtllm_mha_backend`` imported for real; its metadata methods driven on a
stand-in ``self`` holding the buffers they read (as in
``test_trtllm_mha_behaviour.py``), with and without the CPU mirror."""

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

CTX, EXTRA, NUM_DRAFT = 64, 4, 4
REQ_TO_TOKEN = torch.arange(8 * (CTX + EXTRA), dtype=torch.int32).reshape(8, CTX + EXTRA) + 1000
SEQ_LENS = torch.tensor([5, 9])
POOL = torch.tensor([3, 1])


@pytest.fixture(scope="module")
def mods(tmp_path_factory, load_sglang):
    package = copy_tree("0.5.12.post1", tmp_path_factory.mktemp("mha-spec-v2"), "package")
    result = CliRunner().invoke(main, ["apply", str(package)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    sglang = load_sglang(package)
    loaded = NS(
        mha=importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend"),
        rt=importlib.import_module("sglang.srt._patchkit.runtime"),
        modes=importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode,
    )
    assert loaded.mha.__file__.startswith(str(sglang.__path__[0]))
    return loaded


def test_both_classes_opt_out_and_the_decision(mods):
    mha = mods.mha
    assert mha.TRTLLMHAAttnBackend.needs_cpu_seq_lens is False
    assert mha.TRTLLMHAAttnMultiStepDraftBackend.needs_cpu_seq_lens is False
    backends = [object.__new__(mha.TRTLLMHAAttnBackend), object.__new__(mha.TRTLLMHAAttnMultiStepDraftBackend), None]
    args = NS(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=True)
    assert mods.rt.decide_needs_cpu_seq_lens(args, backends) is False


def backend(**extra):
    """What the metadata methods read from the backend (page size 1, no SWA;
    graph buffers as captured for bs 2)."""
    width = CTX  # ceil(max_context_len / page_size)
    graph_md = lambda: NS(  # noqa: E731
        cache_seqlens_int32=torch.zeros(2, dtype=torch.int32),
        cu_seqlens_k=torch.zeros(3, dtype=torch.int32),
        page_table=torch.full((2, width), -1, dtype=torch.int32),
        max_seq_len_k=0,
        max_seq_len_q=1,
        swa_page_table=None,
    )
    fields = dict(
        max_context_len=CTX,
        page_size=1,
        speculative_num_draft_tokens=NUM_DRAFT,
        speculative_step_id=0,
        req_to_token=REQ_TO_TOKEN,
        decode_cuda_graph_metadata={2: graph_md(), "strided_indices": torch.arange(0, CTX, 1)},
        target_verify_metadata={2: graph_md()},
        _copy_swa_page_table=lambda *args: None,
        _maybe_translate_swa=lambda table: None,
        use_sliding_window_kv_pool=False,
    )
    fields.update(extra)
    return NS(**fields)


@pytest.mark.parametrize("mirror", [True, False])
def test_replay_target_verify(mods, mirror):
    b = backend()
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph(
        b,
        2,
        POOL,
        SEQ_LENS,
        None,
        None,
        mods.modes.TARGET_VERIFY,
        NS(),
        seq_lens_cpu=SEQ_LENS.clone() if mirror else None,
    )
    md = b.target_verify_metadata[2]
    assert md.cache_seqlens_int32[:2].tolist() == [5 + NUM_DRAFT, 9 + NUM_DRAFT]
    live = 9 + NUM_DRAFT
    assert md.max_seq_len_k == (live if mirror else CTX + NUM_DRAFT)
    # Built on the device, each row up to its own cache_seqlens, mirror or not
    # (before: the whole static width without the mirror); the rest of a row
    # is never read and keeps what was there.
    for row, kv_len in enumerate(md.cache_seqlens_int32.tolist()):
        assert (md.page_table[row, :kv_len] == REQ_TO_TOKEN[POOL[row], :kv_len]).all()
        assert (md.page_table[row, kv_len:] == -1).all()


@pytest.mark.parametrize("mirror", [True, False])
def test_replay_draft_decode(mods, mirror):
    b = backend(speculative_step_id=1)
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph(
        b,
        2,
        POOL,
        SEQ_LENS,
        None,
        None,
        mods.modes.DECODE,
        NS(),
        seq_lens_cpu=SEQ_LENS.clone() if mirror else None,
    )
    md = b.decode_cuda_graph_metadata[2]
    assert md.cache_seqlens_int32[:2].tolist() == [7, 11]
    for row, kv_len in enumerate([7, 11]):
        assert (md.page_table[row, :kv_len] == REQ_TO_TOKEN[POOL[row], :kv_len]).all()
        assert (md.page_table[row, kv_len:] == -1).all()
    assert md.max_seq_len_k == (11 if mirror else CTX + 2)


def test_eager_draft_extend_v2_without_the_mirror(mods):
    """The GPU-only draft extend: no mirror, prefix lengths a device tensor."""
    b = backend()
    fb = NS(
        forward_mode=mods.modes.DRAFT_EXTEND_V2,
        batch_size=2,
        seq_lens=SEQ_LENS,
        seq_lens_cpu=None,
        req_pool_indices=POOL,
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        spec_info=NS(),
        extend_seq_lens=torch.full((2,), NUM_DRAFT, dtype=torch.int32),
        extend_prefix_lens_cpu=None,
        extend_seq_lens_cpu=None,
    )
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata(b, fb)
    md = b.forward_metadata
    assert md.max_seq_len_q == NUM_DRAFT
    assert md.cu_seqlens_q.tolist() == [0, NUM_DRAFT, 2 * NUM_DRAFT]
    assert_eager_rows(md, [5, 9], page_size=1)


def assert_eager_rows(md, kv_lens, page_size):
    """The eager table is built on the device (sglang #28106's eager half): as
    many pages as a req_to_token row, each row up to its cache_seqlens (what
    the kernels read) and zeros after; no longer as wide as the static bound."""
    pages = -(-(CTX + EXTRA) // page_size)
    assert md.page_table.shape == (2, pages) and md.page_table.dtype == torch.int32
    assert md.cache_seqlens_int32.tolist() == kv_lens
    for row, kv_len in enumerate(kv_lens):
        live = -(-kv_len // page_size)
        want = REQ_TO_TOKEN[POOL[row], 0 : live * page_size : page_size] // page_size
        assert torch.equal(md.page_table[row, :live], want.to(torch.int32))
        assert (md.page_table[row, live:] == 0).all()
    assert md.swa_page_table is None


@pytest.mark.parametrize("mirror", [True, False])
@pytest.mark.parametrize("page_size", [1, 4])
def test_eager_target_verify(mods, mirror, page_size):
    b = backend(page_size=page_size, device="cpu")
    fb = NS(
        forward_mode=mods.modes.TARGET_VERIFY,
        batch_size=2,
        seq_lens=SEQ_LENS,
        seq_lens_cpu=SEQ_LENS.clone() if mirror else None,
        req_pool_indices=POOL,
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        spec_info=NS(),
    )
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata(b, fb)
    assert b.forward_metadata.max_seq_len_k == (9 if mirror else CTX) + NUM_DRAFT
    assert_eager_rows(b.forward_metadata, [5 + NUM_DRAFT, 9 + NUM_DRAFT], page_size)


def test_eager_draft_decode_without_the_mirror(mods):
    b = backend(speculative_step_id=1)
    fb = NS(
        forward_mode=mods.modes.DECODE,
        batch_size=2,
        seq_lens=SEQ_LENS,
        seq_lens_cpu=None,
        req_pool_indices=POOL,
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        spec_info=NS(),
    )
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata(b, fb)
    assert_eager_rows(b.forward_metadata, [7, 11], page_size=1)


def test_eager_sliding_window_keeps_the_gather(mods):
    """A sliding-window backend: the token gather, its translation and its
    striding, as before (page size 4, with the mirror)."""
    b = backend(
        page_size=4, device="cpu", use_sliding_window_kv_pool=True, _maybe_translate_swa=lambda table: table + 100000
    )
    fb = NS(
        forward_mode=mods.modes.TARGET_VERIFY,
        batch_size=2,
        seq_lens=SEQ_LENS,
        seq_lens_cpu=SEQ_LENS.clone(),
        req_pool_indices=POOL,
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        spec_info=NS(),
    )
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata(b, fb)
    md = b.forward_metadata
    tokens = REQ_TO_TOKEN[POOL, : 9 + NUM_DRAFT][:, 0::4]
    assert torch.equal(md.page_table, tokens // 4)
    assert torch.equal(md.swa_page_table, (tokens + 100000) // 4)
