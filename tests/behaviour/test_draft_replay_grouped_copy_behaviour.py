"""draft-replay-grouped-copy, run on CPU: 0.5.12.post1 with the patch, its vendored
``copy_grouped`` and its two patched replays. Every (dst, src) pair is copied exactly
as ``dst.copy_(src)`` would (mixed dtypes, a strided dst), with one
``torch._foreach_copy_`` per group of pairs sharing dtypes and devices;
the draft and draft-extend replays fill their buffers as before, ``hidden_states``
by its own ``copy_``."""

from __future__ import annotations

import importlib
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

I32, I64 = torch.int32, torch.int64
PER_REQ = 3


@pytest.fixture(scope="module")
def tree(tmp_path_factory, load_sglang):
    package = copy_tree("0.5.12.post1", tmp_path_factory.mktemp("grouped-copy"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), "draft-replay-grouped-copy"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    sglang = load_sglang(package)
    modules = {
        name: importlib.import_module(f"sglang.srt.{path}")
        for name, path in (
            ("runtime", "_patchkit.runtime"),
            ("draft", "speculative.eagle_draft_cuda_graph_runner"),
            ("extend", "speculative.eagle_draft_extend_cuda_graph_runner"),
        )
    }
    assert all(module.__file__.startswith(sglang.__path__[0]) for module in modules.values())
    return NS(**modules)


@pytest.fixture
def foreach_calls(monkeypatch):
    """Each ``torch._foreach_copy_`` call's list length; the copy itself still done by torch."""
    calls, real = [], torch._foreach_copy_

    def counted(dsts, srcs, *args, **kwargs):
        calls.append(len(dsts))
        return real(dsts, srcs, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", counted)
    return calls


def test_every_pair_is_copied_with_one_foreach_per_group(tree, foreach_calls):
    strided = torch.zeros(4, 3, dtype=I64)
    pairs = [
        (torch.zeros(5, dtype=I64), torch.arange(5)),
        (strided[:, 1], torch.arange(10, 14)),  # a dst that is not contiguous
        (torch.zeros(3, dtype=I32), torch.tensor([7, 8, 9])),  # int64 into int32
        (torch.zeros(2, 2), torch.tensor([[0.5, 1.5], [2.5, 3.5]])),  # alone in its group
        (torch.zeros(2, dtype=I32), torch.tensor([-1, 2**31 - 1])),
        (torch.zeros(3, dtype=I64), torch.tensor([4, 5, 6], dtype=I32)),  # int32 into int64, alone
    ]
    tree.runtime.copy_grouped(iter(pairs))  # any iterable of pairs
    for dst, src in pairs:
        assert dst.dtype != src.dtype or torch.equal(dst, src)
        assert torch.equal(dst, src.to(dst.dtype))
    assert strided[:, 0].eq(0).all() and strided[:, 2].eq(0).all()  # only the strided column written
    assert sorted(foreach_calls) == [1, 1, 2, 2]  # (int64, int64), (int32, int64), and the two lone pairs


def test_without_foreach_every_pair_is_still_copied(tree, monkeypatch):
    monkeypatch.delattr(torch, "_foreach_copy_")
    pairs = [(torch.zeros(2, dtype=I64), torch.tensor([1, 2])), (torch.zeros(2, dtype=I64), torch.tensor([3, 4]))]
    tree.runtime.copy_grouped(pairs)
    assert [dst.tolist() for dst, _ in pairs] == [[1, 2], [3, 4]]


class Stop(Exception):
    """Raised by the fake attention backend: the replay has filled its buffers."""


def stop(*args, **kwargs):
    raise Stop


def extend_runner():
    n = 4 * PER_REQ
    buffers = NS(
        input_ids=torch.zeros(n, dtype=I64),
        seq_lens=torch.zeros(4, dtype=I32),
        extend_seq_lens=torch.zeros(4, dtype=I32),
        out_cache_loc=torch.zeros(n, dtype=I64),
        positions=torch.zeros(n, dtype=I64),
        hidden_states=torch.zeros(n, 6),
        num_correct_drafts=torch.zeros(4, dtype=I32),
        num_accept_tokens=torch.zeros(4, dtype=I32),
        req_pool_indices=torch.zeros(4, dtype=I64),
        seq_lens_cpu=torch.zeros(4, dtype=I32),
    )
    return NS(
        deepep_adapter=NS(replay=lambda: None),
        buffers=buffers,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        capture_bs=[2, 4],
        num_tokens_per_bs=PER_REQ,
        seq_len_fill_value=1,
        extend_seq_lens_cpu=[PER_REQ] * 4,
        forward_mode=None,
        draft_extend_attn_backend=NS(init_forward_metadata_replay_cuda_graph=stop),
    )


def extend_batch():
    n = 2 * PER_REQ
    return NS(
        batch_size=2,
        input_ids=torch.arange(100, 100 + n, dtype=I32),  # the draft's int32 tokens, an int64 buffer
        seq_lens=torch.tensor([9, 12]),
        seq_lens_sum=21,
        seq_lens_cpu=None,
        extend_seq_lens=torch.tensor([PER_REQ, PER_REQ], dtype=I32),
        extend_seq_lens_cpu=None,
        out_cache_loc=torch.arange(200, 200 + n),
        positions=torch.arange(300, 300 + n),
        req_pool_indices=torch.tensor([5, 6]),
        spec_info=NS(
            hidden_states=torch.rand(n, 6),
            num_correct_drafts=torch.tensor([1, 2], dtype=I32),
            num_accept_tokens=torch.tensor([2, 3], dtype=I32),
        ),
    )


def test_the_draft_extend_replay_fills_every_buffer(tree, foreach_calls):
    runner, fb = extend_runner(), extend_batch()
    with pytest.raises(Stop):
        tree.extend.EAGLEDraftExtendCudaGraphRunner.replay(runner, fb)
    buffers, n = runner.buffers, fb.input_ids.shape[0]
    for field in ("input_ids", "out_cache_loc", "positions"):
        assert getattr(buffers, field)[:n].tolist() == getattr(fb, field).tolist(), field
    for field in ("seq_lens", "extend_seq_lens", "req_pool_indices"):
        assert getattr(buffers, field)[:2].tolist() == getattr(fb, field).tolist(), field
    for field in ("num_correct_drafts", "num_accept_tokens"):
        assert getattr(buffers, field)[:2].tolist() == getattr(fb.spec_info, field).tolist(), field
    assert torch.equal(buffers.hidden_states[:n], fb.spec_info.hidden_states)
    # (int32, int32): extend lens and the accept counts; (int64, int64): out_cache_loc, positions,
    # req_pool_indices; input_ids (int64 <- int32) and seq_lens (int32 <- int64) alone.
    assert sorted(foreach_calls) == [1, 1, 3, 3]


def test_the_draft_replay_fills_every_buffer(tree, foreach_calls, monkeypatch):
    monkeypatch.setattr(tree.draft, "maybe_detect_nan", lambda *a, **k: None)
    monkeypatch.setattr(tree.draft, "maybe_detect_oob", lambda *a, **k: None)
    steps, topk = 3, 1
    buffers = NS(
        seq_lens=torch.zeros(4, dtype=I32),
        out_cache_loc=torch.zeros(4 * steps, dtype=I64),
        positions=torch.zeros(4, dtype=I64),
        topk_p=torch.zeros(4, topk),
        topk_index=torch.zeros(4, topk, dtype=I64),
        hidden_states=torch.zeros(4, 6),
        req_pool_indices=torch.zeros(4, dtype=I64),
    )
    runner = NS(
        deepep_adapter=NS(replay=lambda: None),
        buffers=buffers,
        num_tokens_per_bs=1,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        capture_bs=[2, 4],
        speculative_num_steps=steps,
        model_runner=NS(model_config=NS(vocab_size=32)),
        draft_attn_backend=NS(init_forward_metadata_replay_cuda_graph=stop),
    )
    fb = NS(
        batch_size=2,
        seq_lens=torch.tensor([9, 12]),
        seq_lens_cpu=None,
        out_cache_loc=torch.arange(20, 20 + 2 * steps),
        positions=torch.tensor([8, 11]),
        req_pool_indices=torch.tensor([5, 6]),
        spec_info=NS(
            topk_p=torch.tensor([[0.25], [0.75]]), topk_index=torch.tensor([[3], [4]]), hidden_states=torch.rand(2, 6)
        ),
    )
    with pytest.raises(Stop):
        tree.draft.EAGLEDraftCudaGraphRunner.replay(runner, fb)
    assert buffers.seq_lens[:2].tolist() == [9, 12] and buffers.positions[:2].tolist() == [8, 11]
    assert buffers.out_cache_loc[: 2 * steps].tolist() == fb.out_cache_loc.tolist()
    assert buffers.req_pool_indices[:2].tolist() == [5, 6]
    assert torch.equal(buffers.topk_p[:2], fb.spec_info.topk_p) and torch.equal(
        buffers.topk_index[:2], fb.spec_info.topk_index
    )
    assert torch.equal(buffers.hidden_states[:2], fb.spec_info.hidden_states)
    # (int64, int64): out_cache_loc, positions, topk_index, req_pool_indices; seq_lens and topk_p alone.
    assert sorted(foreach_calls) == [1, 1, 4]
