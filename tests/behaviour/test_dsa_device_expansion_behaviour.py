"""dsa-no-mirror on 0.5.8 imported on CPU: the release's own ``NativeSparseAttnBackend``
builds target-verify and spec-v2 draft-extend metadata (eager ``init_forward_metadata``)
and replays a target-verify CUDA graph (``init_forward_metadata_replay_cuda_graph``).

0.5.7 .. 0.5.9 expand the per-token lengths on the host from the CPU mirror
(``seq_lens_cpu.tolist()``): pristine, a batch without the mirror (what the spec-v2
decode hands over once the seq_lens copy is dropped) fails; patched, the same batch runs
with no host read of a device value, and the expanded lengths (and the top-k lengths
and cumulative lengths built from them) equal what pristine computes from the mirror.
No Triton kernel is on this path: the patch's expansion is torch ops (backends.dsa)."""

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

VERSION = "0.5.8"
D = 3  # speculative_num_draft_tokens
TOPK = 4  # the indexer's top-k (small, so its clamp shows)
CTX = 32  # max_context_len
LENS = [10, 7, 4]  # the requests' lengths (draft tokens included for the draft extend)
POOL = [3, 5, 1]  # their req_to_token rows
BS = 4  # the captured batch size (target verify)


class Device(torch.Tensor):
    """A tensor standing for GPU memory: every read of its values by the host is counted."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__index__", "__float__", "__iter__"):
            Device.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


def device(values, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).as_subclass(Device)


def plain(t: torch.Tensor) -> list:
    return t.as_subclass(torch.Tensor).tolist()


@pytest.fixture(scope="module", params=["pristine", "patched"])
def tree(request, tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp(f"dsa-expand-{request.param}"), "package")
    if request.param == "patched":
        result = CliRunner().invoke(main, ["apply", str(package), "dsa-no-mirror"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    nsa = importlib.import_module("sglang.srt.layers.attention.nsa_backend")
    assert nsa.__file__.startswith(str(package))
    utils = importlib.import_module("sglang.srt.layers.attention.nsa.utils")
    modes = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
    return NS(name=request.param, nsa=nsa, utils=utils, modes=modes)


@pytest.fixture
def backend(tree, monkeypatch):
    for module in (tree.utils, tree.nsa):  # one rank: no distributed state on CPU
        monkeypatch.setattr(module, "get_attention_cp_size", lambda: 1, raising=False)
        monkeypatch.setattr(module, "get_attention_tp_size", lambda: 1, raising=False)
    b = object.__new__(tree.nsa.NativeSparseAttnBackend)
    req_to_token = torch.arange(8 * (CTX + 4), dtype=torch.int32).reshape(8, CTX + 4) + 1000
    b.__dict__.update(
        device=torch.device("cpu"),
        speculative_num_draft_tokens=D,
        speculative_num_steps=D - 1,
        topk=1,
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
    return b


def batch(tree, b, mode, mirror: bool):
    lens = LENS
    n = len(lens)
    # pristine asserts the draft extend's prefix list; the GPU-only draft extend leaves it unset
    prefix = [x - D for x in lens] if tree.name == "pristine" else None
    return NS(
        batch_size=n,
        seq_lens=device(lens),
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
        seq_lens_sum=sum(lens) if mirror else None,
        seq_lens_host_bound=None,
        req_pool_indices=device(POOL),
        req_to_token_pool=NS(req_to_token=b.req_to_token),
        forward_mode=mode,
        extend_seq_lens=device([D] * n, torch.int32) if mode.is_draft_extend_v2() else None,
        extend_seq_lens_cpu=[D] * n if mode.is_draft_extend_v2() else None,
        extend_prefix_lens_cpu=prefix,
        extend_num_tokens=n * D,
        global_num_tokens_cpu=None,
        nsa_cp_metadata=None,
    )


def host_expansion(mode) -> list[int]:
    """What 0.5.8 computes on the host from the mirror: per request, its D query tokens."""
    kv = [n + D for n in LENS] if mode.is_target_verify() else LENS
    return [k - D + j + 1 for k in kv for j in range(D)]


def eager(tree, b, mode, mirror: bool):
    Device.reads = []
    b.init_forward_metadata(batch(tree, b, mode, mirror))
    reads, Device.reads = list(Device.reads), []
    return b.forward_metadata, reads


@pytest.mark.parametrize("mode_name", ["TARGET_VERIFY", "DRAFT_EXTEND_V2"])
def test_pristine_needs_the_mirror_and_expands_on_the_host(tree, backend, mode_name):
    if tree.name != "pristine":
        pytest.skip("the release as shipped")
    mode = getattr(tree.modes, mode_name)
    with pytest.raises((AssertionError, AttributeError)):  # no mirror: `assert seq_lens_cpu is not None` / .tolist()
        eager(tree, backend, mode, mirror=False)
    metadata, _ = eager(tree, backend, mode, mirror=True)
    assert plain(metadata.nsa_seqlens_expanded) == host_expansion(mode)


@pytest.mark.parametrize("mirror", [True, False], ids=["mirror", "no-mirror"])
@pytest.mark.parametrize("mode_name", ["TARGET_VERIFY", "DRAFT_EXTEND_V2"])
def test_patched_expands_on_the_device_without_host_reads(tree, backend, mode_name, mirror):
    if tree.name != "patched":
        pytest.skip("the patched tree")
    mode = getattr(tree.modes, mode_name)
    metadata, reads = eager(tree, backend, mode, mirror)
    assert reads == []  # no .tolist() / .item() / .cpu() of a device value
    expanded = plain(metadata.nsa_seqlens_expanded)
    assert expanded == host_expansion(mode)  # pristine's values, from the device lengths
    topk = plain(metadata.nsa_cache_seqlens_int32)
    assert topk == [min(n, TOPK) for n in expanded]
    assert plain(metadata.nsa_cu_seqlens_k) == [sum(topk[:i]) for i in range(len(topk) + 1)]
    for row, length in enumerate(expanded):  # each query row's page-table entries up to its length
        req = POOL[row // D]
        assert plain(metadata.page_table_1)[row][:length] == backend.req_to_token[req, :length].tolist()


def replay_verify(tree, b, mirror: bool):
    b.init_cuda_graph_state(BS, BS * D)
    b.init_forward_metadata_capture_cuda_graph(
        bs=BS,
        num_tokens=BS * D,
        req_pool_indices=torch.zeros(BS, dtype=torch.int64),
        seq_lens=torch.ones(BS, dtype=torch.int64),  # the runner's fill
        encoder_lens=None,
        forward_mode=tree.modes.TARGET_VERIFY,
        spec_info=None,
    )
    lens = LENS + [1] * (BS - len(LENS))
    Device.reads = []
    b.init_forward_metadata_replay_cuda_graph(
        bs=BS,
        req_pool_indices=device(POOL + [0] * (BS - len(POOL))),
        seq_lens=device(lens),
        seq_lens_sum=sum(lens),
        encoder_lens=None,
        forward_mode=tree.modes.TARGET_VERIFY,
        spec_info=None,
        seq_lens_cpu=torch.tensor(lens) if mirror else None,
    )
    reads, Device.reads = list(Device.reads), []
    return b.decode_cuda_graph_metadata[BS], reads


def test_verify_replay_pristine_reads_the_mirror_patched_reads_nothing(tree, backend):
    lens = LENS + [1] * (BS - len(LENS))
    expected = [n + D - D + j + 1 for n in lens for j in range(D)]
    if tree.name == "pristine":
        with pytest.raises((AssertionError, AttributeError)):
            replay_verify(tree, backend, mirror=False)
        metadata, _ = replay_verify(tree, backend, mirror=True)
        assert plain(metadata.nsa_seqlens_expanded) == expected
        return
    for mirror in (True, False):
        metadata, reads = replay_verify(tree, backend, mirror)
        assert reads == []
        assert plain(metadata.nsa_seqlens_expanded) == expected
