"""CUDA-graph replay and the pinned ``seq_lens_cpu`` buffer (sglang #31364),
on 0.5.12.post1 imported on CPU: a tree with the first five patches (``five``)
and the same tree with every patch (``six``: replay-no-stale-mirror, which
fa3-spec-v2 and trtllm-mha-spec-v2 require, among them).

The runners keep a pinned ``seq_lens_cpu`` buffer and refresh it only when the
batch brings a CPU mirror. With the mirror skipped (needs-cpu-seq-lens), the
five-patch tree still hands that buffer to the attention backend: lengths of
an earlier batch. Harmless there (no opted-out backend reads it at replay:
``tests/trees/test_replay_no_stale_mirror.py`` checks that in the source of every release);
FA3 (and TRT-LLM MHA) read it to size their page tables, so
replay-no-stale-mirror makes replay hand over None instead. Shown here on the verify runner (``CudaGraphRunner.replay_prepare``)
and the draft-extend runner (``EAGLEDraftExtendCudaGraphRunner.replay``).
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
MAX_BS = 4
EARLIER = [33, 44, 55, 66]  # what the pinned buffer holds from an earlier batch


@pytest.fixture(scope="module", params=["five", "six"])
def tree(request, tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp(f"fa3-stale-{request.param}"), "package")
    skipped = [
        "--skip",
        PATCH,
        "--skip",
        "trtllm-mha-spec-v2",
        "--skip",
        "replay-no-stale-mirror",
        "--skip",
        "flashmla-spec-v2",
        "--skip",
        "dsa-no-mirror",  # it requires replay-no-stale-mirror
        "--skip",
        "dsa-draft-extend-graph",  # it requires dsa-no-mirror
    ]
    args = ["apply", str(package)] + (skipped if request.param == "five" else [])
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    sglang = load_sglang(package)
    return NS(
        name=request.param,
        runner=importlib.import_module("sglang.srt.model_executor.cuda_graph_runner"),
        draft_extend=importlib.import_module("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"),
        modes=importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode,
        root=sglang.__path__[0],
    )


class Recorder:
    """An attention backend that records what replay hands it."""

    def __init__(self):
        self.seen = []

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs):
        self.seen.append(kwargs["seq_lens_cpu"])


def pinned():
    return torch.tensor(EARLIER, dtype=torch.int32)


def forward_batch(mirror: bool, raw_bs=2):
    lens = torch.tensor([7, 8], dtype=torch.int32)[:raw_bs]
    return NS(
        batch_size=raw_bs,
        seq_lens=lens,
        seq_lens_cpu=lens.clone() if mirror else None,
        seq_lens_sum=int(lens.sum()) if mirror else None,
        spec_info=NS(),
        forward_mode=None,
        input_ids=torch.zeros(raw_bs, dtype=torch.int64),
    )


# --- the verify runner --------------------------------------------------------------------


def verify_runner(tree, backend):
    def populate(forward_batch, raw_bs, bs, seq_len_fill_value, **_):
        # What DecodeInputBuffers.populate_from_forward_batch does with the two
        # length buffers: the device one always, the pinned mirror only when
        # the batch has one (cuda_graph_runner.py:393 in 0.5.12.post1).
        buffers.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        if forward_batch.seq_lens_cpu is not None:
            if bs != raw_bs:
                buffers.seq_lens_cpu.fill_(seq_len_fill_value)
            buffers.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)

    buffers = NS(
        seq_lens=torch.ones(MAX_BS, dtype=torch.int32),
        seq_lens_cpu=pinned(),
        req_pool_indices=torch.zeros(MAX_BS, dtype=torch.int64),
        populate_from_forward_batch=populate,
    )
    return NS(
        buffers=buffers,
        recapture_if_needed=lambda fb: None,
        require_mlp_tp_gather=False,
        capture_bs=[1, 2, 4],
        num_tokens_per_bs=4,
        seq_len_fill_value=1,
        require_gathered_buffer=False,
        nsa_enable_prefill_cp=False,
        model_runner=NS(spec_algorithm=NS(is_dflash=lambda: False), is_draft_worker=False, hisparse_coordinator=None),
        enable_two_batch_overlap=False,
        enable_pdmux=False,
        attn_backend=backend,
        is_encoder_decoder=False,
        capture_forward_mode=tree.modes.TARGET_VERIFY,
    )


@pytest.fixture
def replay_prepare(tree, monkeypatch):
    monkeypatch.setattr(tree.runner, "enable_num_token_non_padded", lambda: False)

    def run(fb):
        fb.forward_mode = tree.modes.TARGET_VERIFY
        backend = Recorder()
        tree.runner.CudaGraphRunner.replay_prepare(verify_runner(tree, backend), fb)
        (seen,) = backend.seen
        return seen

    return run


def test_verify_replay_without_the_mirror(tree, replay_prepare):
    seen = replay_prepare(forward_batch(mirror=False))
    if tree.name == "five":
        # The stale read: an earlier batch's lengths, handed over as if current.
        assert seen is not None and seen.tolist() == EARLIER[:2]
    else:
        assert seen is None


def test_verify_replay_with_the_mirror_is_unchanged(tree, replay_prepare):
    seen = replay_prepare(forward_batch(mirror=True, raw_bs=2))
    assert seen.tolist() == [7, 8]
    seen = replay_prepare(forward_batch(mirror=True, raw_bs=1))
    assert seen.tolist() == [7]


# --- the draft-extend runner ------------------------------------------------------------------

PER_REQ = 3


def draft_extend_runner(tree, backend):
    i32, i64 = torch.int32, torch.int64
    max_tokens = MAX_BS * PER_REQ
    buffers = NS(
        input_ids=torch.zeros(max_tokens, dtype=i64),
        req_pool_indices=torch.zeros(MAX_BS, dtype=i64),
        out_cache_loc=torch.zeros(max_tokens, dtype=i64),
        positions=torch.zeros(max_tokens, dtype=i64),
        hidden_states=torch.zeros(max_tokens, 6),
        seq_lens=torch.ones(MAX_BS, dtype=i32),
        seq_lens_cpu=pinned(),
        extend_seq_lens=torch.full((MAX_BS,), PER_REQ, dtype=i32),
        num_correct_drafts=torch.zeros(MAX_BS, dtype=i32),
        num_accept_tokens=torch.zeros(MAX_BS, dtype=i32),
        global_num_tokens_gpu=None,
        global_num_tokens_for_logprob_gpu=None,
    )
    logits = importlib.import_module("sglang.srt.layers.logits_processor")
    outputs = {
        bs: logits.LogitsProcessorOutput(
            next_token_logits=torch.zeros(bs * PER_REQ, 5), hidden_states=torch.zeros(bs * PER_REQ, 6)
        )
        for bs in (1, 2, 4)
    }
    return NS(
        deepep_adapter=NS(replay=lambda: None),
        buffers=buffers,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        capture_bs=[1, 2, 4],
        num_tokens_per_bs=PER_REQ,
        seq_len_fill_value=1,
        extend_seq_lens_cpu=[PER_REQ] * MAX_BS,
        draft_extend_attn_backend=backend,
        _replay=lambda fb: None,
        output_buffers=outputs,
        forward_mode=tree.modes.DRAFT_EXTEND_V2,
        model_runner=NS(device_timer=None),
    )


def draft_extend_batch(mirror: bool):
    fb = forward_batch(mirror)
    n = 2 * PER_REQ
    fb.extend_seq_lens = None
    fb.extend_seq_lens_cpu = [PER_REQ, PER_REQ]
    fb.out_cache_loc = fb.positions = torch.arange(n)
    fb.input_ids = torch.zeros(n, dtype=torch.int64)
    fb.req_pool_indices = torch.arange(2)
    fb.spec_info = NS(
        hidden_states=torch.zeros(n, 6),
        num_correct_drafts=torch.zeros(2, dtype=torch.int32),
        num_accept_tokens=torch.full((2,), PER_REQ, dtype=torch.int32),
    )
    return fb


@pytest.mark.parametrize("mirror", [False, True])
def test_draft_extend_replay(tree, mirror):
    backend = Recorder()
    tree.draft_extend.EAGLEDraftExtendCudaGraphRunner.replay(
        draft_extend_runner(tree, backend), draft_extend_batch(mirror)
    )
    (seen,) = backend.seen
    if mirror:
        assert seen[:2].tolist() == [7, 8]
    elif tree.name == "five":
        assert seen is not None and seen.tolist() == EARLIER  # stale
    else:
        assert seen is None
