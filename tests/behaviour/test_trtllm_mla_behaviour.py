"""trtllm-mla-spec-v2 and trtllm-mla-draft-skip-template, run: the patched
0.5.12.post1 (and 0.5.9) ``trtllm_mla_backend`` imported on CPU, its parents' GPU-only
parts and the step backends replaced by mocks."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSIONS = ["0.5.12.post1", "0.5.9"]  # 0.5.9: a release before 0.5.10 (issue 43)
MODULE = "sglang.srt.layers.attention.trtllm_mla_backend"
PATCHES = ("trtllm-mla-spec-v2", "trtllm-mla-draft-skip-template")


@pytest.fixture(scope="module", params=VERSIONS)
def mla(request, tmp_path_factory, load_sglang):
    """The patched module (a private copy of the release, patched by the CLI)."""
    package = copy_tree(request.param, tmp_path_factory.mktemp("mla"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), *PATCHES], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    import importlib

    module = importlib.import_module(MODULE)
    assert module.__file__.startswith(str(package))
    return module


def model_runner(num_draft_tokens):
    config = SimpleNamespace(
        num_attention_heads=16,
        get_num_kv_heads=lambda tp: 1,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        scaling=0.1,
    )
    return SimpleNamespace(
        model_config=config,
        kv_cache_dtype=torch.bfloat16,
        dtype=torch.bfloat16,
        page_size=64,
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((4, 256), dtype=torch.int32)),
        device="cpu",
        server_args=SimpleNamespace(speculative_num_draft_tokens=num_draft_tokens),
    )


def parent_init(self, model_runner, skip_prefill=False, *args, **kwargs):
    """What TRTLLMMLABackend reads from FlashInferMLAAttnBackend.__init__."""
    self.max_context_len = 256
    self.device = torch.device("cpu")
    self.skip_prefill = skip_prefill


def make_backend(mla, num_draft_tokens, skip_prefill=False):
    parent = mla.FlashInferMLAAttnBackend
    with (
        mock.patch.object(parent, "__init__", parent_init),
        mock.patch.object(mla, "get_attention_tp_size", return_value=1),
        mock.patch.object(
            mla, "get_global_server_args", return_value=SimpleNamespace(disable_chunked_prefix_cache=True)
        ),
        mock.patch.object(mla, "global_zero_init_workspace_buffer", torch.zeros(1, dtype=torch.uint8)),
    ):
        return mla.TRTLLMMLABackend(model_runner(num_draft_tokens), skip_prefill=skip_prefill)


def init_cuda_graph_state(mla, backend, max_bs=4, max_num_tokens=16):
    """Run it with the parent's (CUDA-allocating) part mocked; return what the
    mask was when the parent was handed over to."""
    seen = {}

    def parent(self, *args, **kwargs):
        seen["mask"] = self.cuda_graph_custom_mask

    with mock.patch.object(mla.FlashInferMLAAttnBackend, "init_cuda_graph_state", parent):
        backend.init_cuda_graph_state(max_bs, max_num_tokens)
    return seen


# --- #26824 ---------------------------------------------------------------------------


def test_both_classes_opt_out_of_cpu_seq_lens(mla):
    assert mla.TRTLLMMLABackend.needs_cpu_seq_lens is False
    assert mla.TRTLLMMLAMultiStepDraftBackend.needs_cpu_seq_lens is False


def test_init_sets_the_mask_to_none(mla):
    backend = make_backend(mla, num_draft_tokens=4)
    assert backend.cuda_graph_custom_mask is None
    assert backend.get_verify_buffers_to_fill_after_draft() == [None, None]


def test_mask_allocated_for_spec_before_the_parent_runs(mla):
    backend = make_backend(mla, num_draft_tokens=4)
    seen = init_cuda_graph_state(mla, backend, max_bs=4, max_num_tokens=16)
    mask = backend.cuda_graph_custom_mask
    assert mask is not None and seen["mask"] is mask
    assert mask.dtype == torch.bool
    # trtllm-gen reads no tree mask: the compact QLEN_ONLY layout, D cells a
    # verify token instead of context + D (sglang #32920); the worker asks the
    # kernel for that layout.
    assert mask.shape == (16 * 4,) and backend.verify_tree_mask_is_read is False
    assert mask.device.type == "cpu"
    assert not mask.any()
    buffers = backend.get_verify_buffers_to_fill_after_draft()
    assert len(buffers) == 2 and buffers[0] is mask and buffers[1] is None


def test_no_mask_on_the_draft_workers_instance(mla):
    """sglang #31527: the draft worker's draft-extend backend never verifies."""
    parent = mla.FlashInferMLAAttnBackend
    runner = model_runner(4)
    runner.is_draft_worker = True
    with (
        mock.patch.object(parent, "__init__", parent_init),
        mock.patch.object(mla, "get_attention_tp_size", return_value=1),
        mock.patch.object(
            mla, "get_global_server_args", return_value=SimpleNamespace(disable_chunked_prefix_cache=True)
        ),
        mock.patch.object(mla, "global_zero_init_workspace_buffer", torch.zeros(1, dtype=torch.uint8)),
    ):
        backend = mla.TRTLLMMLABackend(runner)
    seen = init_cuda_graph_state(mla, backend)
    assert backend.is_draft_runner is True
    assert backend.cuda_graph_custom_mask is None and seen["mask"] is None


@pytest.mark.parametrize("num_draft_tokens, skip_prefill", [(None, False), (0, False), (4, True)])
def test_no_mask_without_draft_tokens_or_when_prefill_is_skipped(mla, num_draft_tokens, skip_prefill):
    backend = make_backend(mla, num_draft_tokens=num_draft_tokens, skip_prefill=skip_prefill)
    seen = init_cuda_graph_state(mla, backend)
    assert backend.cuda_graph_custom_mask is None and seen["mask"] is None
    assert backend.get_verify_buffers_to_fill_after_draft() == [None, None]


def test_build_tree_fills_the_buffer_in_place_without_seq_lens_sum(mla):
    """The consumer, eagle_utils.build_tree_kernel_efficient, takes the buffer
    as the FULL_MASK tree mask and writes into it: with seq_lens_sum=None (the
    GPU-only spec-v2 path) nothing is sized from a host value."""
    from sglang.srt.speculative import eagle_utils

    backend = make_backend(mla, num_draft_tokens=4)
    init_cuda_graph_state(mla, backend, max_bs=2, max_num_tokens=8)
    tree_mask_buf, position_buf = backend.get_verify_buffers_to_fill_after_draft()
    kernel = mock.Mock()
    with (
        mock.patch.object(eagle_utils, "sgl_build_tree_kernel_efficient", kernel, create=True),
        mock.patch.object(eagle_utils, "_is_npu", False),
    ):
        out = eagle_utils.build_tree_kernel_efficient(
            torch.tensor([1, 2]),  # bonus tokens
            torch.zeros((2, 4), dtype=torch.long),  # parent_list
            torch.zeros((2, 3), dtype=torch.long),  # top_scores_index
            torch.zeros((2, 3), dtype=torch.long),  # draft tokens
            torch.tensor([5, 7]),  # seq_lens
            None,  # seq_lens_sum: no CPU mirror
            1,
            3,
            4,
            eagle_utils.TreeMaskMode.FULL_MASK,
            tree_mask_buf,
            position_buf,
        )
    assert out[0] is backend.cuda_graph_custom_mask
    assert backend.cuda_graph_custom_mask.all()  # FULL_MASK starts all True, in place
    assert kernel.call_args.args[3] is backend.cuda_graph_custom_mask


def eager_batch(mode, seq_lens_cpu):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        batch_size=2,
        forward_mode=getattr(ForwardMode, mode),
        req_pool_indices=torch.tensor([0, 1]),
        seq_lens=torch.tensor([5, 7]),
        seq_lens_cpu=seq_lens_cpu,
        extend_seq_lens=torch.tensor([4, 4]),
        extend_seq_lens_cpu=[4, 4],
    )


@pytest.mark.parametrize("mode", ["DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"])
def test_eager_metadata_without_the_mirror_reads_nothing_from_the_device(mla, mode):
    """sglang 0.5.16: with the opt-out the batch has no mirror, and the eager
    metadata takes the static bound, not seq_lens.max().item() (a host wait
    every eager step): no .item() is called at all; with the mirror, its max."""
    backend = make_backend(mla, num_draft_tokens=4)
    backend._create_block_kv_indices = mock.Mock(return_value=torch.zeros((2, 4), dtype=torch.int32))
    verify = 4 if mode == "TARGET_VERIFY" else 0
    with mock.patch.object(torch.Tensor, "item", side_effect=AssertionError("a device value read on the host")):
        backend.init_forward_metadata(eager_batch(mode, None))
    assert backend.forward_decode_metadata.max_seq_len_k == backend.max_context_len + verify
    backend.init_forward_metadata(eager_batch(mode, torch.tensor([5, 7])))
    assert backend.forward_decode_metadata.max_seq_len_k == 7 + verify


# --- #26241 ---------------------------------------------------------------------------


def draft_backend(mla, speculative_num_steps):
    """A multi-step backend whose step backends are autospec mocks of
    TRTLLMMLABackend (calls are checked against the real signatures) and whose
    parent's common_template fails the test if reached."""
    backend = object.__new__(mla.TRTLLMMLAMultiStepDraftBackend)
    backend.speculative_num_steps = speculative_num_steps
    backend.topk = 1
    backend.attn_backends = [
        mock.create_autospec(mla.TRTLLMMLABackend, instance=True) for _ in range(speculative_num_steps - 1)
    ]
    backend.generate_draft_decode_kv_indices = mock.Mock(side_effect=AssertionError("kv-indices kernel launched"))
    return backend


def forward_batch():
    return SimpleNamespace(
        batch_size=2,
        req_pool_indices=torch.tensor([0, 1]),
        seq_lens=torch.tensor([5, 7]),
        seq_lens_cpu=torch.tensor([5, 7]),
        seq_lens_sum=None,
        spec_info=object(),
        forward_mode="draft decode",
    )


@pytest.mark.parametrize("steps", [2, 4])
def test_draft_init_forward_metadata_calls_each_step_once(mla, steps):
    backend = draft_backend(mla, steps)
    batch = forward_batch()
    template = mock.Mock(side_effect=AssertionError("common_template called"))
    with mock.patch.object(mla.FlashInferMLAMultiStepDraftBackend, "common_template", template):
        backend.init_forward_metadata(batch)
    template.assert_not_called()
    for step in backend.attn_backends:
        step.init_forward_metadata.assert_called_once_with(batch)
        step.init_forward_metadata_replay_cuda_graph.assert_not_called()


@pytest.mark.parametrize("steps", [2, 4])
def test_draft_replay_calls_each_step_once_in_decode_mode(mla, steps):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = draft_backend(mla, steps)
    batch = forward_batch()
    template = mock.Mock(side_effect=AssertionError("common_template called"))
    with mock.patch.object(mla.FlashInferMLAMultiStepDraftBackend, "common_template", template):
        backend.init_forward_metadata_replay_cuda_graph(batch, 2)
    template.assert_not_called()
    for step in backend.attn_backends:
        step.init_forward_metadata_replay_cuda_graph.assert_called_once_with(
            2,
            batch.req_pool_indices,
            batch.seq_lens,
            seq_lens_sum=None,
            encoder_lens=None,
            forward_mode=ForwardMode.DECODE,
            spec_info=batch.spec_info,
            seq_lens_cpu=batch.seq_lens_cpu,
        )
        step.init_forward_metadata.assert_not_called()


def test_draft_capture_keeps_the_parents_path(mla):
    """Capture is not part of #26241: it still goes through the parent."""
    assert "init_forward_metadata_capture_cuda_graph" not in vars(mla.TRTLLMMLAMultiStepDraftBackend)
