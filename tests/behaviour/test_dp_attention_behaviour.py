"""DP attention, two-batch overlap (TBO), DeepEP and the DP LM head on the
patched 0.5.12.post1, imported on CPU (docs/research/dp-attention.md):

* each setting as the release parses it (``ServerArgs``' own handlers);
* the decision the patched ``Scheduler.init_overlap`` takes for it, with the
  real backend classes DeepSeek runs on, listed by the real
  ``EAGLEWorkerV2.spec_v2_attn_backends``, on every DP rank;
* TBO's split of a verify batch, the reader of the mirror that makes TBO keep it.

Every release's decision (0.5.10 .. 0.5.13, 0.5.23) is in
tests/trees/test_dp_attention_decision.py.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from dp_settings import SETTINGS, rank_view  # noqa: E402
from support import linked_copy  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import fetch_tree  # noqa: E402

VERSION = "0.5.12.post1"
ATTN = "sglang.srt.layers.attention."
#: DeepSeek's spec-v2 backends: target (verify), multi-step draft, draft
#: extend, draft runner. FA3 is the default on Hopper; FlashInfer MLA keeps the mirror.
BACKENDS = {
    "fa3": ("flashattention_backend.FlashAttentionBackend", "flashattention_backend.FlashAttentionMultiStepBackend"),
    "flashmla": ("flashmla_backend.FlashMLABackend", "flashmla_backend.FlashMLAMultiStepDraftBackend"),
    "trtllm_mla": ("trtllm_mla_backend.TRTLLMMLABackend", "trtllm_mla_backend.TRTLLMMLAMultiStepDraftBackend"),
    "triton": ("triton_backend.TritonAttnBackend", "triton_backend.TritonMultiStepDraftBackend"),
    "flashinfer_mla": (
        "flashinfer_mla_backend.FlashInferMLAAttnBackend",
        "flashinfer_mla_backend.FlashInferMLAMultiStepDraftBackend",
    ),
}
KEEPS_MIRROR = {"flashinfer_mla"}
#: The decision and the flags of the backends above (with what they require).
PATCHES = ("needs-cpu-seq-lens", "piecewise-no-forced-mirror", "fa3-spec-v2", "flashmla-spec-v2", "trtllm-mla-spec-v2")


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    """The patched tree, imported."""
    package = linked_copy(fetch_tree(VERSION), tmp_path_factory.mktemp("dp") / "sglang")
    result = CliRunner().invoke(main, ["apply", str(package), *PATCHES], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture
def rt(sglang):
    import sglang.srt._patchkit.runtime as runtime

    yield runtime
    runtime.set_needs_cpu_seq_lens(True)


@pytest.fixture
def parse(sglang, monkeypatch):
    """parse(fields) -> server args after the release's own handlers for
    piecewise CUDA graph, data parallelism and the MoE all-to-all, in
    ``__post_init__``'s order, on a CUDA machine (the platform probes say so)."""
    from sglang.srt import server_args as module

    for probe in ("is_hip", "is_npu", "is_cpu", "is_mps", "is_xpu"):
        monkeypatch.setattr(module, probe, lambda: False)
    cls = module.ServerArgs

    def run(fields):
        defaults = {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
        model = NS(is_piecewise_cuda_graph_disabled_model=False, is_multimodal=False)
        # chunked_prefill_size: what _handle_gpu_memory_settings (run before) sets on an 80 GB card.
        args = NS(
            **{**defaults, "model_path": "/models/DeepSeek-V3", "chunked_prefill_size": 8192, **fields},
            get_model_config=lambda: model,
        )
        for handler in ("_handle_piecewise_cuda_graph", "_handle_data_parallelism", "_handle_a2a_moe"):
            getattr(cls, handler)(args)
        return args

    return run


def test_the_release_parses_the_settings(parse):
    tp4, dp4 = parse(SETTINGS["tp4"][0]), parse(SETTINGS["dp-attention"][0])
    assert tp4.disable_piecewise_cuda_graph is False and tp4.enable_dp_attention is False
    assert dp4.enable_dp_attention is True and dp4.disable_piecewise_cuda_graph is True  # "2. DP attention"
    deepep = parse(SETTINGS["dp-attention+deepep"][0])
    assert deepep.ep_size == 4 and deepep.disable_piecewise_cuda_graph is True and not deepep.disable_cuda_graph
    # DeepEP's normal mode turns CUDA graphs off: every spec-v2 step runs the eager metadata paths.
    assert parse(SETTINGS["dp-attention+deepep-normal"][0]).disable_cuda_graph is True
    # --enable-dp-attention with one DP rank is no DP attention (nor a DP LM head).
    alone = parse({"enable_dp_attention": True, "enable_dp_lm_head": True, "dp_size": 1})
    assert alone.enable_dp_attention is False and alone.enable_dp_lm_head is False


def backends(name):
    """Real instances (their GPU-bound __init__ not run) as the real
    EAGLEWorkerV2.spec_v2_attn_backends lists them."""
    import importlib

    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    target_cls, draft_cls = (
        getattr(importlib.import_module(ATTN + path.rpartition(".")[0]), path.rpartition(".")[2])
        for path in BACKENDS[name]
    )
    target, draft, extend, runner = (c.__new__(c) for c in (target_cls, draft_cls, target_cls, target_cls))
    worker = EAGLEWorkerV2.__new__(EAGLEWorkerV2)
    worker._target_worker = NS(model_runner=NS(attn_backend=target))
    worker._draft_worker = NS(
        draft_attn_backend=draft, draft_extend_attn_backend=extend, draft_runner=NS(attn_backend=runner)
    )
    return worker.spec_v2_attn_backends


@pytest.fixture
def init_overlap(sglang, rt, monkeypatch):
    """init_overlap(scheduler) -> the decision the patched Scheduler.init_overlap takes."""
    from sglang.srt.managers import scheduler as module
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setattr(module, "FutureMap", lambda *a, **kw: "future-map")
    monkeypatch.setattr(module, "use_mlx", lambda: False)

    def run(me):
        me.__dict__.update(
            device="cpu",
            forward_stream=torch.cpu.Stream(),
            enable_overlap=True,
            max_running_requests=8,
            chunked_prefill_size=64,
            model_config=NS(context_len=128),
            spec_algorithm=SpeculativeAlgorithm.EAGLE,
        )
        rt.set_needs_cpu_seq_lens(True)
        module.Scheduler.init_overlap(me)
        return rt.needs_cpu_seq_lens()

    return run


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_patched_scheduler_decides_per_setting_on_every_dp_rank(parse, init_overlap, backend):
    listed = backends(backend)
    # A class without the flag counts as keeping the mirror (FlashInfer MLA's draft backend).
    assert {getattr(b, "needs_cpu_seq_lens", True) for b in listed} == {backend in KEEPS_MIRROR}
    for name, (fields, keeps_mirror) in SETTINGS.items():
        args = parse(fields)
        per_rank = {init_overlap(rank_view(args, listed, rank)) for rank in range(args.dp_size)}
        assert per_rank == {keeps_mirror or backend in KEEPS_MIRROR}, (backend, name)


def test_tbo_wraps_the_target_backend_in_one_that_keeps_the_mirror(sglang):
    """Under TBO the target runner's backend is a TboAttnBackend (model_runner:
    init_attention_backend), which declares nothing: the OR keeps the mirror
    even without the decision's own TBO rule."""
    from sglang.srt.layers.attention.tbo_backend import TboAttnBackend

    assert TboAttnBackend.needs_cpu_seq_lens is True


def verify_input(sglang, seq_lens_cpu):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, draft = 2, 2
    return EagleVerifyInput(
        draft_token=torch.arange(bs * draft),
        custom_mask=torch.ones(64, dtype=torch.bool),
        positions=torch.arange(bs * draft),
        retrieve_index=torch.zeros(bs, draft, dtype=torch.long),
        retrieve_next_token=torch.zeros(bs, draft, dtype=torch.long),
        retrieve_next_sibling=torch.zeros(bs, draft, dtype=torch.long),
        retrieve_cum_len=None,
        spec_steps=1,
        topk=1,
        draft_token_num=draft,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None if seq_lens_cpu is None else int(seq_lens_cpu.sum()),
        seq_lens_cpu=seq_lens_cpu,
    )


def test_tbo_splits_a_verify_batch_by_its_mirror(sglang):
    """two_batch_overlap.split_spec_info cuts the verify tree mask at offsets
    summed from ``spec_info.seq_lens_cpu``: without the mirror it cannot split."""
    from sglang.srt.batch_overlap.two_batch_overlap import split_spec_info

    child = split_spec_info(verify_input(sglang, torch.tensor([5, 7])), 1, 2, 2, 4)
    assert child.seq_lens_cpu.tolist() == [7] and child.custom_mask.numel() == 64 - (5 + 2) * 2
    with pytest.raises(AttributeError):
        split_spec_info(verify_input(sglang, None), 1, 2, 2, 4)


def dp_padded(sglang, batch, bs):
    """``batch`` after the real ForwardBatch._pad_inputs_to_size to ``bs``
    requests (one token each), as prepare_mlp_sync_batch pads every DP rank's."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    fields = dict(
        lora_ids=[],
        out_cache_loc_swa=None,
        encoder_lens=None,
        positions=batch.input_ids.clone(),
        mamba_track_indices=None,
        mamba_track_mask=None,
        mamba_track_seqlens=None,
        mrope_positions=None,
        extend_seq_lens=None,
        spec_info=None,
    )
    padded = NS(
        **{
            **fields,
            **{
                k: getattr(batch, k)
                for k in ("input_ids", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc")
            },
        }
    )
    padded._pad_tensor_to_size = lambda tensor, size, value=0: ForwardBatch._pad_tensor_to_size(
        padded, tensor, size, value=value
    )
    runner = NS(attn_backend=NS(get_cuda_graph_seq_len_fill_value=lambda: 1))
    ForwardBatch._pad_inputs_to_size(padded, runner, bs, bs)
    return padded


def test_dp_padding_of_a_busy_rank_without_the_mirror_and_an_idle_rank_with_one(sglang, monkeypatch):
    """An idle DP rank's batch always has a mirror (prepare_for_idle: empty, sum 0);
    a busy rank's lacks it once the decision drops it. The DP padding pads both
    and reads the mirror only where there is one."""
    from sglang.srt.managers import schedule_batch as module

    monkeypatch.setattr(module.SamplingBatchInfo, "from_schedule_batch", lambda *a: "sampling")
    idle = NS(device="cpu", model_config=NS(vocab_size=32))
    module.ScheduleBatch.prepare_for_idle(idle)
    assert idle.seq_lens_cpu.numel() == 0 and idle.seq_lens_sum == 0 and idle.forward_mode.is_idle()
    busy = NS(
        input_ids=torch.tensor([3]),
        req_pool_indices=torch.tensor([0]),
        seq_lens=torch.tensor([9]),
        seq_lens_cpu=None,
        seq_lens_sum=None,
        out_cache_loc=torch.tensor([9]),
    )

    idle, busy = dp_padded(sglang, idle, 2), dp_padded(sglang, busy, 2)
    assert idle.seq_lens_cpu.tolist() == [1, 1] and idle.seq_lens_sum == 2
    assert busy.seq_lens.tolist() == [9, 1] and busy.seq_lens_cpu is None and busy.seq_lens_sum is None
