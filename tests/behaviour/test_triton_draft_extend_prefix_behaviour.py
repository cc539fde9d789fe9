"""triton-draft-extend-prefix, run: the patched 0.5.12.post1 ``triton_backend``
imported on CPU, ``TritonAttnBackend.init_forward_metadata_replay_cuda_graph``
driven as the draft-extend graph runner replays it (its page-table gather
recorded): a V2 draft extend's prefix is seq_lens less the extend lengths,
clamped for the padded rows; V1's draft extend and a replay without the
extend lengths keep seq_lens, as pristine does."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")

MODULE = "sglang.srt.layers.attention.triton_backend"
PATCH = "triton-draft-extend-prefix"
STEPS = 3  # speculative_num_steps: 4 tokens a request, as EAGLE3's top-k 1 defaults


@pytest.fixture(scope="module")
def triton_backend(load_patched):
    return load_patched("0.5.12.post1", PATCH, MODULE)


def replay(module, mode, seq_lens, spec_info):
    """(kv_indptr, the lengths the gather read) of one replay at ``len(seq_lens)`` rows."""
    bs = len(seq_lens)
    backend = object.__new__(module.TritonAttnBackend)
    backend.device = "cpu"
    backend.speculative_num_steps = STEPS
    backend.qo_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    backend.kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    backend.cuda_graph_kv_indices = torch.zeros(1024, dtype=torch.int64)
    backend.req_to_token = torch.zeros(bs, 64, dtype=torch.int32)
    gather = mock.MagicMock()
    with mock.patch.object(module, "create_flashinfer_kv_indices_triton", gather):
        backend.init_forward_metadata_replay_cuda_graph(
            bs=bs,
            req_pool_indices=torch.arange(bs),
            seq_lens=seq_lens,
            seq_lens_sum=int(seq_lens.sum()),
            encoder_lens=None,
            forward_mode=mode,
            spec_info=spec_info,
            seq_lens_cpu=seq_lens.clone(),
        )
    (call,) = gather.__getitem__.return_value.call_args_list  # create_flashinfer_kv_indices_triton[(bs,)](...)
    return backend.kv_indptr.tolist(), call.args[2].tolist()


def test_a_v2_draft_extend_reads_the_prefix_alone(triton_backend):
    modes = triton_backend.ForwardMode
    # two live rows (prefix 5 and 17, 4 draft tokens each, seq_lens bumped by spec v2), one padded (fill 1)
    seq_lens = torch.tensor([9, 21, 1], dtype=torch.int32)
    extend = SimpleNamespace(extend_seq_lens_tensor=torch.tensor([4, 4, 4], dtype=torch.int32))
    indptr, gathered = replay(triton_backend, modes.DRAFT_EXTEND_V2, seq_lens, extend)
    assert gathered == [5, 17, 0] and indptr == [0, 5, 22, 22]


def test_v1_and_a_replay_without_extend_lengths_keep_seq_lens(triton_backend):
    modes = triton_backend.ForwardMode
    seq_lens = torch.tensor([9, 21, 1], dtype=torch.int32)
    extend = SimpleNamespace(extend_seq_lens_tensor=torch.tensor([4, 4, 4], dtype=torch.int32))
    assert replay(triton_backend, modes.DRAFT_EXTEND, seq_lens, extend) == ([0, 9, 30, 31], [9, 21, 1])
    assert replay(triton_backend, modes.DRAFT_EXTEND_V2, seq_lens, SimpleNamespace()) == ([0, 9, 30, 31], [9, 21, 1])
