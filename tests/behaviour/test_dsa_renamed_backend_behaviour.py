"""dsa-no-mirror on 0.5.14 imported on CPU: the release's own ``DeepseekSparseAttnBackend``
builds target-verify and spec-v2 draft-extend metadata (eager ``init_forward_metadata``)
from the batch the GPU-only path hands over once the seq_lens copy is dropped
(``ForwardBatch.init_new``'s "gpu_only: leave *_cpu unset"): no CPU mirror, no
``seq_lens_sum``, no ``extend_prefix_lens_cpu``; the draft extend's
``extend_seq_lens_cpu = [D] * bs`` is what the worker supplies (0.5.13 / 0.5.14's
``prepare_for_extend_to_fill_draft_kvcache`` / ``prepare_for_draft_extend``).

Pristine, that batch fails (``assert forward_batch.seq_lens_cpu is not None``, then the
draft extend's assert of ``extend_prefix_lens_cpu``); patched, it runs with no host read
of a device value (no ``.item()`` / ``.tolist()`` / ``.cpu()``), and the expanded lengths,
top-k lengths, cumulative lengths and page-table rows equal what pristine computes when
the host lengths are there. With them, the patched tree computes exactly pristine's
metadata, the page table's width included. The target-verify graph replay
(``_apply_cuda_graph_metadata``) likewise: pristine asserts the mirror, patched replays
with and without it, reading nothing. With dsa-draft-extend-graph (the patched tree
has both), the spec-v2 draft-extend replay of 0.5.14's own branch: pristine reads the
accepted counts (``.tolist()``), patched writes the captured width with no host read,
the padded rows clamped at 0, the live rows as the eager draft extend builds them.

``seqlens_expand_triton`` is a Triton kernel (CUDA only): the module gets the pure-torch
reference of test_dsa_draft_extend_graph_behaviour (``expand``); the device tensors and
their read counter are test_dsa_device_expansion_behaviour's."""

from __future__ import annotations

import importlib
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402
from test_dsa_device_expansion_behaviour import Device, device, plain  # noqa: E402
from test_dsa_draft_extend_graph_behaviour import expand  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSION = "0.5.14"
D = 3  # speculative_num_draft_tokens
TOPK = 4  # the indexer's top-k (small, so its clamp shows)
CTX = 32  # max_context_len
LENS = [10, 7, 4]  # the requests' lengths (draft tokens included for the draft extend)
POOL = [3, 5, 1]  # their req_to_token rows


@pytest.fixture(scope="module", params=["pristine", "patched"])
def tree(request, tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp(f"dsa-renamed-{request.param}"), "package")
    if request.param == "patched":
        # dsa-draft-extend-graph pulls in dsa-no-mirror; it changes only the replay's draft-extend branch
        result = CliRunner().invoke(main, ["apply", str(package), "dsa-draft-extend-graph"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    dsa = importlib.import_module("sglang.srt.layers.attention.dsa_backend")
    assert dsa.__file__.startswith(str(package))
    utils = importlib.import_module("sglang.srt.layers.attention.dsa.utils")
    modes = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
    return NS(name=request.param, dsa=dsa, utils=utils, modes=modes)


@pytest.fixture
def backend(tree, monkeypatch):
    monkeypatch.setattr(tree.dsa, "seqlens_expand_triton", expand)
    monkeypatch.setattr(tree.utils, "get_parallel", lambda: NS(attn_cp_size=1, attn_tp_size=1))  # one rank
    b = object.__new__(tree.dsa.DeepseekSparseAttnBackend)
    req_to_token = torch.arange(8 * (CTX + 4), dtype=torch.int32).reshape(8, CTX + 4) + 1000
    b.__dict__.update(
        device=torch.device("cpu"),
        speculative_num_draft_tokens=D,
        speculative_num_steps=D - 1,
        topk=1,
        dsa_index_topk=TOPK,
        max_context_len=CTX,
        real_page_size=1,
        req_to_token=req_to_token,
        req_to_token_pool=NS(req_to_token=req_to_token),
        dsa_decode_impl="fa3",
        dsa_prefill_impl="flashmla_sparse",
        enable_auto_select_prefill_impl=False,
        dsa_kv_cache_store_fp8=False,
        hisparse_coordinator=None,
        use_mha=False,
        _arange_buf=torch.arange(64, dtype=torch.int32),
    )
    return b


def batch(mode, host_lengths: bool):
    """The batch ``ForwardBatch.init_new`` builds: with the host lengths (the mirror kept),
    or GPU-only (none of them; the draft extend's query lengths the worker supplies)."""
    n = len(LENS)
    draft = mode.is_draft_extend_v2()
    return NS(
        batch_size=n,
        seq_lens=device(LENS),
        seq_lens_cpu=torch.tensor(LENS) if host_lengths else None,
        seq_lens_sum=sum(LENS) if host_lengths else None,
        req_pool_indices=device(POOL),
        forward_mode=mode,
        extend_seq_lens=device([D] * n, torch.int32) if draft else None,
        extend_seq_lens_cpu=[D] * n if draft else None,
        extend_prefix_lens=device([x - D for x in LENS], torch.int32) if draft else None,
        extend_prefix_lens_cpu=[x - D for x in LENS] if draft and host_lengths else None,
        extend_num_tokens=n * D if draft else None,
        global_num_tokens_cpu=None,
        attn_cp_metadata=None,
    )


def eager(b, mode, host_lengths: bool):
    Device.reads = []
    b.init_forward_metadata(batch(mode, host_lengths))
    reads, Device.reads = list(Device.reads), []
    return b.forward_metadata, reads


def values(metadata) -> dict:
    """What the kernels read: each query row's lengths and page-table entries up to its length."""
    expanded = plain(metadata.dsa_seqlens_expanded)
    table = plain(metadata.page_table_1)
    return {
        "expanded": expanded,
        "topk": plain(metadata.dsa_cache_seqlens_int32),
        "cu_topk": plain(metadata.dsa_cu_seqlens_k),
        "cache_seqlens": plain(metadata.cache_seqlens_int32),
        "cu_seqlens_k": plain(metadata.cu_seqlens_k),
        "cu_seqlens_q": plain(metadata.cu_seqlens_q),
        "max_seq_len_q": metadata.max_seq_len_q,
        "extend_lens": list(metadata.dsa_extend_seq_lens_list),
        "rows": [row[:length] for row, length in zip(table, expanded)],
    }


def expected(b, mode) -> dict:
    """What pristine 0.5.14 computes with the host lengths there (the pristine test checks
    it does): per request, its D query rows of lengths ``kv - D + j + 1``."""
    kv = [n + D for n in LENS] if mode.is_target_verify() else LENS
    expanded = [k - D + j + 1 for k in kv for j in range(D)]
    topk = [min(e, TOPK) for e in expanded]
    return {
        "expanded": expanded,
        "topk": topk,
        "cu_topk": [sum(topk[:i]) for i in range(len(topk) + 1)],
        "cache_seqlens": kv,
        "cu_seqlens_k": [sum(kv[:i]) for i in range(len(kv) + 1)],
        "cu_seqlens_q": list(range(len(LENS) * D + 1)),
        "max_seq_len_q": 1,
        "extend_lens": [D] * len(LENS),
        "rows": [b.req_to_token[POOL[r // D], :length].tolist() for r, length in enumerate(expanded)],
    }


MODES = ["TARGET_VERIFY", "DRAFT_EXTEND_V2"]


@pytest.mark.parametrize("mode_name", MODES)
def test_pristine_needs_the_host_lengths(tree, backend, mode_name):
    if tree.name != "pristine":
        pytest.skip("the release as shipped")
    mode = getattr(tree.modes, mode_name)
    with pytest.raises(AssertionError):  # `assert forward_batch.seq_lens_cpu is not None`
        eager(backend, mode, host_lengths=False)
    if mode.is_draft_extend_v2():  # with the mirror but not the prefix list, the draft extend's assert
        b = batch(mode, host_lengths=True)
        b.extend_prefix_lens_cpu = None
        with pytest.raises(AssertionError, match="All of them must not be None"):
            backend.init_forward_metadata(b)
    metadata, _ = eager(backend, mode, host_lengths=True)
    assert values(metadata) == expected(backend, mode)
    assert len(plain(metadata.page_table_1)[0]) == max(LENS) + (D if mode.is_target_verify() else 0)


@pytest.mark.parametrize("mode_name", MODES)
def test_patched_runs_without_the_host_lengths_and_reads_nothing(tree, backend, mode_name):
    if tree.name != "patched":
        pytest.skip("the patched tree")
    mode = getattr(tree.modes, mode_name)
    for host_lengths in (False, True):
        metadata, reads = eager(backend, mode, host_lengths)
        assert reads == []  # no .tolist() / .item() / .cpu() of a device value
        assert values(metadata) == expected(backend, mode)  # pristine's values with the host lengths
        width = len(plain(metadata.page_table_1)[0])
        extra = D if mode.is_target_verify() else 0
        # with the mirror pristine's width; without it the static bound (0.5.13+ keep no host bound)
        assert width == (max(LENS) + extra if host_lengths else CTX + extra)
        assert metadata.max_seq_len_k == width


BS = 4  # the captured batch size (target verify)


def replay_verify(tree, b, mirror: bool):
    """Capture a target-verify graph at BS, then replay it for LENS padded with the fill length 1."""
    b.init_cuda_graph_state(BS, BS * D)
    b._apply_cuda_graph_metadata(  # the first call for a size builds its tables (the capture)
        bs=BS,
        req_pool_indices=torch.zeros(BS, dtype=torch.int64),
        seq_lens=torch.ones(BS, dtype=torch.int64),
        seq_lens_cpu=torch.ones(BS, dtype=torch.int64),
        forward_mode=tree.modes.TARGET_VERIFY,
        spec_info=None,
    )
    lens = LENS + [1] * (BS - len(LENS))
    Device.reads = []
    b._apply_cuda_graph_metadata(
        bs=BS,
        req_pool_indices=device(POOL + [0] * (BS - len(POOL))),
        seq_lens=device(lens),
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
        forward_mode=tree.modes.TARGET_VERIFY,
        spec_info=None,
    )
    reads, Device.reads = list(Device.reads), []
    return b.decode_cuda_graph_metadata[BS], reads


def test_verify_replay_pristine_reads_the_mirror_patched_reads_nothing(tree, backend):
    lens = LENS + [1] * (BS - len(LENS))
    expanded = [n + j + 1 for n in lens for j in range(D)]
    if tree.name == "pristine":
        with pytest.raises(AssertionError):  # `assert seq_lens_cpu is not None`
            replay_verify(tree, backend, mirror=False)
        metadata, _ = replay_verify(tree, backend, mirror=True)
        assert plain(metadata.dsa_seqlens_expanded) == expanded
        return
    for mirror in (True, False):
        metadata, reads = replay_verify(tree, backend, mirror)
        assert reads == []
        assert plain(metadata.dsa_seqlens_expanded) == expanded
        assert plain(metadata.dsa_cache_seqlens_int32) == [min(e, TOPK) for e in expanded]
        table = plain(metadata.page_table_1)
        for row, length in enumerate(expanded[: len(LENS) * D]):  # the live rows' entries up to their lengths
            assert table[row][:length] == backend.req_to_token[POOL[row // D], :length].tolist()


LIVE, ACCEPTED = LENS[:2], [2, 1]  # the draft-extend replay: 2 live requests padded to BS; what verify accepted


def replay_draft_extend(tree, b, mirror: bool):
    """Capture a DRAFT_EXTEND_V2 graph at BS, then replay 2 live requests padded with the fill length 1."""
    b.init_cuda_graph_state(BS, BS * D)
    b._apply_cuda_graph_metadata(
        bs=BS,
        req_pool_indices=torch.zeros(BS, dtype=torch.int64),
        seq_lens=torch.ones(BS, dtype=torch.int64),
        seq_lens_cpu=torch.ones(BS, dtype=torch.int64),
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        spec_info=NS(num_accept_tokens=torch.full((BS,), D, dtype=torch.int32)),
    )
    lens = LIVE + [1] * (BS - len(LIVE))
    Device.reads = []
    b._apply_cuda_graph_metadata(
        bs=BS,
        req_pool_indices=device(POOL[: len(LIVE)] + [0] * (BS - len(LIVE))),
        seq_lens=device(lens),
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        spec_info=NS(num_accept_tokens=device(ACCEPTED + [D] * (BS - len(ACCEPTED)), torch.int32)),
    )
    reads, Device.reads = list(Device.reads), []
    return b.decode_cuda_graph_metadata[BS], reads


def test_draft_extend_replay_pristine_at_the_counts_patched_at_the_width(tree, backend):
    lens = LIVE + [1] * (BS - len(LIVE))
    fixed = [max(n - D + j + 1, 0) for n in lens for j in range(D)]
    if tree.name == "pristine":
        metadata, reads = replay_draft_extend(tree, backend, mirror=True)
        assert "tolist" in reads  # spec_info.num_accept_tokens[:bs].tolist(): a host wait per draft extend
        written = plain(metadata.dsa_seqlens_expanded)[: sum(ACCEPTED) + D * (BS - len(ACCEPTED))]
        assert written != fixed[: len(written)]  # rows at the accepted counts, not the width
        return
    eager, _ = eager_draft_extend(tree, backend)
    rows = len(LIVE) * D
    for mirror in (True, False):
        metadata, reads = replay_draft_extend(tree, backend, mirror)
        assert reads == []
        expanded = plain(metadata.dsa_seqlens_expanded)
        assert expanded == fixed and expanded[rows:] == [0, 0, 1] * (BS - len(LIVE))  # clamped, not [-1, 0, 1]
        assert plain(metadata.dsa_cache_seqlens_int32) == [min(n, TOPK) for n in expanded]
        assert expanded[:rows] == eager["expanded"]
        table = plain(metadata.page_table_1)
        assert [row[:length] for row, length in zip(table, expanded[:rows])] == eager["rows"]


def eager_draft_extend(tree, b):
    """The eager draft extend of the live requests, GPU-only (the patched tree's values)."""
    n = len(LIVE)
    Device.reads = []
    b.init_forward_metadata(
        NS(
            batch_size=n,
            seq_lens=device(LIVE),
            seq_lens_cpu=None,
            seq_lens_sum=None,
            req_pool_indices=device(POOL[:n]),
            forward_mode=tree.modes.DRAFT_EXTEND_V2,
            extend_seq_lens=device([D] * n, torch.int32),
            extend_seq_lens_cpu=[D] * n,
            extend_prefix_lens=device([x - D for x in LIVE], torch.int32),
            extend_prefix_lens_cpu=None,
            extend_num_tokens=n * D,
            global_num_tokens_cpu=None,
            attn_cp_metadata=None,
        )
    )
    reads, Device.reads = list(Device.reads), []
    return values(b.forward_metadata), reads
