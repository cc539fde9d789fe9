"""dsa-draft-extend-graph (sglang #29413 + #30378) on 0.5.12.post1 imported on CPU:
the release's own ``NativeSparseAttnBackend`` captures a spec-v2 draft-extend graph
(bs 4, 3 draft tokens) and replays it for a batch of 2 live requests padded to 4
(the padded rows carry the graph's fill length 1, as the draft-extend runner and
DP-attention idle companions hand them over).

Pristine, the replay reads the accepted counts to the host (``.tolist()``) and
expands only their sum of rows; patched, it writes the captured width with no
host read of a device value, the padded rows' lengths are clamped at 0, and the
live rows hold what the eager ``init_forward_metadata`` builds for the same batch.

``seqlens_expand_triton`` is a Triton kernel (CUDA only): the test hands the
module a pure-torch reference of what it computes (``expand``), so the host-side
logic around it is what runs here."""

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
D = 3  # speculative_num_draft_tokens (spec v2: topk 1, num_steps + 1)
TOPK = 4  # the indexer's top-k (small, so its clamp shows)
CTX = 32  # max_context_len
BS, LIVE = 4, [10, 7]  # the captured batch size; the live requests' lengths (draft tokens included)
POOL = [3, 5]  # their req_to_token rows
ACCEPTED = [2, 1]  # what verify accepted (read by the v1 path only)


class Device(torch.Tensor):
    """A tensor standing for GPU memory: every read of its values by the host is counted."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__index__", "__float__"):
            Device.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


def device(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).as_subclass(Device)


def plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor)


def expand(extend_seq_lens, seq_lens, total_len, max_q_len):
    """What seqlens_expand_triton computes (utils.py): row i, token j of its
    ``extend_seq_lens[i]`` gets ``seq_lens[i] - extend_seq_lens[i] + j + 1``."""
    qo, kv = plain(extend_seq_lens).long(), plain(seq_lens).long()
    row = torch.repeat_interleave(torch.arange(len(qo)), qo)
    start = torch.cumsum(qo, 0) - qo
    j = torch.arange(int(qo.sum())) - start[row]
    out = (kv[row] - qo[row] + j + 1).to(torch.int32)
    assert out.numel() == total_len
    return out


@pytest.fixture(scope="module", params=["pristine", "patched"])
def tree(request, tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp(f"dsa-graph-{request.param}"), "package")
    if request.param == "patched":
        result = CliRunner().invoke(main, ["apply", str(package), "dsa-draft-extend-graph"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    nsa = importlib.import_module("sglang.srt.layers.attention.nsa_backend")
    utils = importlib.import_module("sglang.srt.layers.attention.nsa.utils")
    modes = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
    return NS(name=request.param, nsa=nsa, utils=utils, modes=modes)


@pytest.fixture
def backend(tree, monkeypatch):
    monkeypatch.setattr(tree.nsa, "seqlens_expand_triton", expand)
    monkeypatch.setattr(tree.utils, "get_attention_cp_size", lambda: 1)
    b = object.__new__(tree.nsa.NativeSparseAttnBackend)
    req_to_token = torch.arange(8 * (CTX + 4), dtype=torch.int32).reshape(8, CTX + 4) + 1000
    b.__dict__.update(
        device=torch.device("cpu"),
        speculative_num_draft_tokens=D,
        nsa_index_topk=TOPK,
        max_context_len=CTX,
        real_page_size=1,
        req_to_token=req_to_token,
        nsa_decode_impl="fa3",
        nsa_prefill_impl="flashmla_sparse",
        enable_auto_select_prefill_impl=False,
        nsa_kv_cache_store_fp8=False,
        use_mha=False,
        _arange_buf=torch.arange(64, dtype=torch.int32),
    )
    b.init_cuda_graph_state(BS, BS * D)
    capture = [1] * BS  # the runner's fill
    b.init_forward_metadata_capture_cuda_graph(
        bs=BS,
        num_tokens=BS * D,
        req_pool_indices=torch.zeros(BS, dtype=torch.int64),
        seq_lens=torch.tensor(capture, dtype=torch.int32),
        encoder_lens=None,
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        spec_info=NS(num_accept_tokens=torch.full((BS,), D, dtype=torch.int32)),
    )
    return b


def replay(tree, b, mirror: bool):
    """The draft-extend runner's replay of 2 live requests padded to the captured 4."""
    lens = LIVE + [1] * (BS - len(LIVE))
    Device.reads = []
    b.init_forward_metadata_replay_cuda_graph(
        bs=BS,
        req_pool_indices=device(POOL + [0] * (BS - len(POOL))).long(),
        seq_lens=device(lens),
        seq_lens_sum=sum(lens),
        encoder_lens=None,
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        spec_info=NS(num_accept_tokens=device(ACCEPTED + [D] * (BS - len(ACCEPTED)))),
        seq_lens_cpu=torch.tensor(lens, dtype=torch.int32) if mirror else None,
    )
    reads, Device.reads = list(Device.reads), []
    return b.decode_cuda_graph_metadata[BS], reads


def fixed_width_lengths() -> list[int]:
    lens = LIVE + [1] * (BS - len(LIVE))
    return [max(n - D + j + 1, 0) for n in lens for j in range(D)]


def test_pristine_replay_reads_the_accepted_counts_at_their_width(tree, backend):
    if tree.name != "pristine":
        pytest.skip("the release as shipped")
    metadata, reads = replay(tree, backend, mirror=True)
    assert "tolist" in reads  # spec_info.num_accept_tokens[:bs].tolist(): a host wait per draft extend
    written = plain(metadata.nsa_seqlens_expanded).tolist()[: sum(ACCEPTED) + D * (BS - len(ACCEPTED))]
    assert written != fixed_width_lengths()[: len(written)]  # rows at the accepted counts, not the width


@pytest.mark.parametrize("mirror", [True, False], ids=["mirror", "no-mirror"])
def test_patched_replay_is_fixed_width_without_host_reads(tree, backend, mirror):
    if tree.name != "patched":
        pytest.skip("the patched tree")
    metadata, reads = replay(tree, backend, mirror)
    assert reads == []  # no .tolist() / .item() of a device value
    expanded = plain(metadata.nsa_seqlens_expanded).tolist()
    assert len(expanded) == BS * D and expanded == fixed_width_lengths()
    # padded rows (fill length 1 < width 3) would be [-1, 0, 1]: clamped, never negative
    assert expanded[len(LIVE) * D :] == [0, 0, 1] * (BS - len(LIVE))
    topk = plain(metadata.nsa_cache_seqlens_int32).tolist()
    assert topk == [min(n, TOPK) for n in expanded]
    cu = plain(metadata.nsa_cu_seqlens_k).tolist()
    assert cu[: BS * D + 1] == [sum(topk[:i]) for i in range(BS * D + 1)]  # monotone: no negative row


def test_patched_replay_matches_the_eager_metadata_for_live_rows(tree, backend):
    if tree.name != "patched":
        pytest.skip("the patched tree")
    live = len(LIVE)
    batch = NS(
        batch_size=live,
        seq_lens=torch.tensor(LIVE, dtype=torch.int32),
        seq_lens_cpu=None,
        seq_lens_sum=None,
        seq_lens_host_bound=None,
        req_pool_indices=torch.tensor(POOL, dtype=torch.int64),
        req_to_token_pool=NS(req_to_token=backend.req_to_token),
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        extend_seq_lens=torch.full((live,), D, dtype=torch.int32),
        extend_seq_lens_cpu=[D] * live,
        extend_prefix_lens_cpu=None,
        extend_num_tokens=live * D,
        global_num_tokens_cpu=None,
    )
    backend.init_forward_metadata(batch)
    eager = backend.forward_metadata
    graph, reads = replay(tree, backend, mirror=False)
    assert reads == []
    rows = live * D
    assert plain(graph.cache_seqlens_int32)[:live].tolist() == eager.cache_seqlens_int32.tolist()
    assert plain(graph.nsa_seqlens_expanded)[:rows].tolist() == eager.nsa_seqlens_expanded.tolist()
    assert plain(graph.nsa_cache_seqlens_int32)[:rows].tolist() == eager.nsa_cache_seqlens_int32.tolist()
    assert plain(graph.nsa_cu_seqlens_k)[: rows + 1].tolist() == eager.nsa_cu_seqlens_k.tolist()
    for row, length in enumerate(plain(eager.nsa_seqlens_expanded).tolist()):  # what each query row may read
        assert torch.equal(plain(graph.page_table_1)[row, :length], eager.page_table_1[row, :length])
