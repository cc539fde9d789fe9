"""trtllm-mha-draft-extend-v2 (sglang #25002) on CPU: the patched modules of
0.5.12.post1 (in this process) and of 0.5.10 / 0.5.11 (a subprocess each),
imported for real, driven with stand-ins for the GPU parts.

* the spec-v2 draft worker's whitelist captures a draft-extend CUDA graph for a
  TRTLLMHAAttnBackend (and still for none of the others it did not list);
* the TRT-LLM MHA backend's capture/replay metadata handles DRAFT_EXTEND_V2
  with a fixed stride, in place, and leaves V1's cumsum path as it was;
* the draft-extend CUDA-graph runner's replay returns logits and hidden states
  only for V2, and still the top-k slices for V1.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree, fetch_tree  # noqa: E402

VERSION = "0.5.12.post1"
PATCH = "trtllm-mha-draft-extend-v2"


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    """The patched tree's ``sglang`` package, imported on CPU."""
    package = copy_tree(VERSION, tmp_path_factory.mktemp("mha-v2"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PATCH], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture(scope="module")
def mods(sglang):
    names = {
        "worker": "sglang.srt.speculative.eagle_worker_v2",
        "mha": "sglang.srt.layers.attention.trtllm_mha_backend",
        "runner": "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
        "fbi": "sglang.srt.model_executor.forward_batch_info",
        "logits": "sglang.srt.layers.logits_processor",
    }
    loaded = {key: importlib.import_module(name) for key, name in names.items()}
    for mod in loaded.values():
        assert "patchkit" not in mod.__file__ and mod.__file__.startswith(str(sglang.__path__[0]))
    return NS(**loaded)


# --- whitelist ---------------------------------------------------------------------------


class _CapturedRunner:
    def __init__(self, worker):
        self.worker = worker


def _draft_worker(backend):
    return NS(
        server_args=NS(disable_cuda_graph=False, model_impl="auto"),
        speculative_num_steps=1,  # no draft-decode graph: only the draft-extend decision runs
        device="cuda",
        gpu_id=0,
        target_worker=NS(device="cuda"),
        draft_attn_backend=None,
        draft_extend_attn_backend=backend,
    )


@pytest.fixture
def cuda_worker_module(mods, monkeypatch):
    """eagle_worker_v2 as it behaves on a CUDA machine, capture replaced by a recorder."""
    w = mods.worker
    for flag, value in {"_is_cuda": True, "_is_musa": False, "_is_npu": False, "_is_hip": False}.items():
        monkeypatch.setattr(w, flag, value)
    monkeypatch.setattr(w, "EAGLEDraftExtendCudaGraphRunner", _CapturedRunner)
    monkeypatch.setattr(w, "get_available_gpu_memory", lambda *a, **k: 0.0)
    return w


def test_whitelist_accepts_trtllm_mha_backend(cuda_worker_module, mods):
    w = cuda_worker_module
    assert w.TRTLLMHAAttnBackend is mods.mha.TRTLLMHAAttnBackend  # the module-level import
    backend = object.__new__(mods.mha.TRTLLMHAAttnBackend)  # no __init__: no model runner needed
    worker = _draft_worker(backend)
    w.EagleDraftWorker.init_cuda_graphs(worker)
    assert isinstance(worker.cuda_graph_runner_for_draft_extend, _CapturedRunner)
    assert worker.cuda_graph_runner_for_draft_extend.worker is worker


def test_whitelist_still_lists_the_others_and_nothing_else(cuda_worker_module, mods):
    w = cuda_worker_module
    for cls in (w.TritonAttnBackend, w.TRTLLMMLABackend):
        worker = _draft_worker(object.__new__(cls))
        w.EagleDraftWorker.init_cuda_graphs(worker)
        assert isinstance(worker.cuda_graph_runner_for_draft_extend, _CapturedRunner), cls
    worker = _draft_worker(object())
    w.EagleDraftWorker.init_cuda_graphs(worker)
    assert worker.cuda_graph_runner_for_draft_extend is None


def test_whitelist_off_cuda(mods, monkeypatch):
    w = mods.worker
    for flag in ("_is_cuda", "_is_musa", "_is_npu", "_is_hip"):
        monkeypatch.setattr(w, flag, False)
    worker = _draft_worker(object.__new__(mods.mha.TRTLLMHAAttnBackend))
    w.EagleDraftWorker.init_cuda_graphs(worker)
    assert worker.cuda_graph_runner_for_draft_extend is None


# --- TRT-LLM MHA capture / replay metadata -------------------------------------------------

MAX_BS, PAGES = 4, 16


def _mha_backend():
    """The attributes the draft-extend capture/replay branches read."""
    return NS(
        draft_extend_metadata={
            "cache_seqlens": torch.zeros(MAX_BS, dtype=torch.int32),
            "cu_seqlens_k": torch.zeros(MAX_BS + 1, dtype=torch.int32),
            "page_table": torch.zeros(MAX_BS, PAGES, dtype=torch.int32),
            "strided_indices": torch.arange(0, PAGES, 1),
        },
        req_to_token=torch.arange(MAX_BS * PAGES, dtype=torch.int32).reshape(MAX_BS, PAGES),
        page_size=1,
        _bind_swa_page_table=lambda *a, **k: None,
        _copy_swa_page_table=lambda *a, **k: None,
    )


def _capture(mods, backend, mode, bs, stride):
    seq_lens = torch.full((bs,), 5, dtype=torch.int32)
    spec = NS(num_tokens_per_req=-1, num_accept_tokens=torch.full((MAX_BS,), stride, dtype=torch.int32))
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph(
        backend,
        bs=bs,
        num_tokens=bs * stride,
        req_pool_indices=torch.arange(bs),
        seq_lens=seq_lens,
        encoder_lens=None,
        forward_mode=mode,
        spec_info=spec,
    )
    return backend.draft_extend_metadata[bs]


def _replay(mods, backend, mode, bs, spec):
    seq_lens = torch.tensor([5, 6, 7, 8][:bs], dtype=torch.int32)
    mods.mha.TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph(
        backend,
        bs=bs,
        req_pool_indices=torch.arange(bs),
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        encoder_lens=None,
        forward_mode=mode,
        spec_info=spec,
        seq_lens_cpu=seq_lens.clone(),
    )
    return backend.forward_metadata


def test_v2_capture_and_replay_fixed_stride_in_place(mods):
    v2 = mods.fbi.ForwardMode.DRAFT_EXTEND_V2
    backend = _mha_backend()
    captured = _capture(mods, backend, v2, bs=3, stride=4)
    assert captured.max_seq_len_q == 4 and captured.cu_seqlens_q.tolist() == [0, 4, 8, 12]
    buffer, ptr = captured.cu_seqlens_q, captured.cu_seqlens_q.data_ptr()
    captured.cu_seqlens_q.fill_(-1)  # whatever was there: replay must rewrite it

    # The worker's V2 batch: num_tokens_per_req set, accepted counts vary (and must not matter).
    spec = NS(
        num_tokens_per_req=4,
        num_accept_tokens=torch.tensor([1, 4, 2], dtype=torch.int32),
        num_accept_tokens_cpu=[1, 4, 2],
    )
    md = _replay(mods, backend, v2, 3, spec)
    assert md is captured
    assert md.max_seq_len_q == 4
    assert md.cu_seqlens_q is buffer and md.cu_seqlens_q.data_ptr() == ptr
    assert md.cu_seqlens_q.dtype == torch.int32 and md.cu_seqlens_q.tolist() == [0, 4, 8, 12]
    assert md.cache_seqlens_int32.tolist() == [5, 6, 7]
    assert md.cu_seqlens_k.tolist() == [0, 5, 11, 18]


def test_v2_replay_with_capture_style_spec_info_falls_back(mods):
    v2 = mods.fbi.ForwardMode.DRAFT_EXTEND_V2
    backend = _mha_backend()
    _capture(mods, backend, v2, bs=2, stride=3)
    synthetic = NS(
        num_tokens_per_req=-1, num_accept_tokens=torch.full((MAX_BS,), 3, dtype=torch.int32), num_accept_tokens_cpu=None
    )
    md = _replay(mods, backend, v2, 2, synthetic)
    assert md.max_seq_len_q == 3 and md.cu_seqlens_q.tolist() == [0, 3, 6]


def test_v1_replay_keeps_its_cumsum_path(mods):
    v1 = mods.fbi.ForwardMode.DRAFT_EXTEND
    backend = _mha_backend()
    _capture(mods, backend, v1, bs=3, stride=4)
    spec = NS(
        num_tokens_per_req=4,
        num_accept_tokens=torch.tensor([1, 4, 2], dtype=torch.int32),
        num_accept_tokens_cpu=[1, 4, 2],
    )
    md = _replay(mods, backend, v1, 3, spec)
    assert md.max_seq_len_q == 4  # max(num_accept_tokens_cpu), not the stride
    assert md.cu_seqlens_q.tolist() == [0, 1, 5, 7]


# --- draft-extend CUDA-graph runner replay ---------------------------------------------------

VOCAB, HIDDEN, PER_REQ = 11, 6, 3
CAPTURE_BS = [1, 2, 4]


def _runner(mods, mode):
    max_bs = max(CAPTURE_BS)
    max_tokens = max_bs * PER_REQ
    i32, i64 = torch.int32, torch.int64
    buffers = NS(
        input_ids=torch.zeros(max_tokens, dtype=i64),
        req_pool_indices=torch.zeros(max_bs, dtype=i64),
        out_cache_loc=torch.zeros(max_tokens, dtype=i64),
        positions=torch.zeros(max_tokens, dtype=i64),
        hidden_states=torch.zeros(max_tokens, HIDDEN),
        seq_lens=torch.ones(max_bs, dtype=i32),
        seq_lens_cpu=torch.ones(max_bs, dtype=i32),
        extend_seq_lens=torch.full((max_bs,), PER_REQ, dtype=i32),
        num_correct_drafts=torch.zeros(max_bs, dtype=i32),
        num_accept_tokens=torch.zeros(max_bs, dtype=i32),
        global_num_tokens_gpu=None,
        global_num_tokens_for_logprob_gpu=None,
    )
    rows = max_tokens if mode == mods.fbi.ForwardMode.DRAFT_EXTEND_V2 else max_bs
    outputs = {}
    for bs in CAPTURE_BS:
        out = mods.logits.LogitsProcessorOutput(
            next_token_logits=torch.randn(rows, VOCAB), hidden_states=torch.randn(rows, HIDDEN)
        )
        out.topk_p, out.topk_index = torch.rand(rows, 1), torch.zeros(rows, 1, dtype=i64)
        outputs[bs] = out
    return NS(
        deepep_adapter=NS(replay=lambda: None),
        buffers=buffers,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        capture_bs=CAPTURE_BS,
        num_tokens_per_bs=PER_REQ,
        seq_len_fill_value=1,
        extend_seq_lens_cpu=[PER_REQ] * max_bs,
        draft_extend_attn_backend=NS(init_forward_metadata_replay_cuda_graph=lambda **k: None),
        _replay=lambda forward_batch: None,
        output_buffers=outputs,
        forward_mode=mode,
        model_runner=NS(device_timer=None),
    )


def _forward_batch(raw_bs):
    n = raw_bs * PER_REQ
    return NS(
        batch_size=raw_bs,
        input_ids=torch.arange(n),
        seq_lens=torch.full((raw_bs,), 9, dtype=torch.int32),
        extend_seq_lens=None,
        out_cache_loc=torch.arange(n),
        positions=torch.arange(n),
        spec_info=NS(
            hidden_states=torch.randn(n, HIDDEN),
            num_correct_drafts=torch.full((raw_bs,), 2, dtype=torch.int32),
            num_accept_tokens=torch.full((raw_bs,), 3, dtype=torch.int32),
        ),
        req_pool_indices=torch.arange(raw_bs),
        seq_lens_cpu=torch.full((raw_bs,), 9, dtype=torch.int32),
        extend_seq_lens_cpu=None,
        seq_lens_sum=9 * raw_bs,
    )


def test_v2_replay_output_has_no_topk(mods):
    runner = _runner(mods, mods.fbi.ForwardMode.DRAFT_EXTEND_V2)
    out = mods.runner.EAGLEDraftExtendCudaGraphRunner.replay(runner, _forward_batch(3))  # padded to bs 4
    full = runner.output_buffers[4]
    assert runner.bs == 4 and runner.raw_bs == 3
    assert torch.equal(out.next_token_logits, full.next_token_logits[: 3 * PER_REQ])
    assert torch.equal(out.hidden_states, full.hidden_states[: 3 * PER_REQ])
    assert getattr(out, "topk_p", None) is None and getattr(out, "topk_index", None) is None


def test_v1_replay_still_carries_topk(mods):
    runner = _runner(mods, mods.fbi.ForwardMode.DRAFT_EXTEND)
    out = mods.runner.EAGLEDraftExtendCudaGraphRunner.replay(runner, _forward_batch(3))
    full = runner.output_buffers[4]
    assert torch.equal(out.next_token_logits, full.next_token_logits[:3])
    assert torch.equal(out.topk_p, full.topk_p[:3]) and torch.equal(out.topk_index, full.topk_index[:3])


# --- the other naming generations, one interpreter each ----------------------------------
# 0.5.10 (`_is_cuda and (...)`, `accept_length`) and 0.5.11 (`num_accepted_tokens`);
# 0.5.12 has 0.5.12.post1's shape. Each import takes ~15 s of one core, so both run at once.

OTHER_TREES = ["0.5.10", "0.5.11"]

_CHILD = r"""
import importlib, json, sys
from types import SimpleNamespace as NS
sys.path.insert(0, sys.argv[1])
from sglang_cpu_env import import_sglang_tree, install_import_stubs, unimportable
unimportable(("patchkit",)).__enter__()  # a serving environment: no patchkit at all
install_import_stubs(sys.argv[3])
import_sglang_tree(sys.argv[2])
import torch
w = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")
mha = importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend")
importlib.import_module("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner")
FM = importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
report = {}

class Captured:
    def __init__(self, worker):
        pass

w._is_cuda, w._is_npu, w._is_hip = True, False, False
if hasattr(w, "_is_musa"):
    w._is_musa = False
w.EAGLEDraftExtendCudaGraphRunner = Captured
w.get_available_gpu_memory = lambda *a, **k: 0.0
def captured(backend):
    worker = NS(server_args=NS(disable_cuda_graph=False, model_impl="auto"), speculative_num_steps=1,
                device="cuda", gpu_id=0, target_worker=NS(device="cuda"), draft_attn_backend=None,
                draft_extend_attn_backend=backend)
    w.EagleDraftWorker.init_cuda_graphs(worker)
    return isinstance(worker.cuda_graph_runner_for_draft_extend, Captured)
report["whitelist_mha"] = captured(object.__new__(mha.TRTLLMHAAttnBackend))
report["whitelist_other"] = captured(object())

def backend():
    return NS(draft_extend_metadata={"cache_seqlens": torch.zeros(4, dtype=torch.int32),
                                     "cu_seqlens_k": torch.zeros(5, dtype=torch.int32),
                                     "page_table": torch.zeros(4, 16, dtype=torch.int32),
                                     "strided_indices": torch.arange(16)},
              req_to_token=torch.arange(64, dtype=torch.int32).reshape(4, 16), page_size=1,
              _bind_swa_page_table=lambda *a, **k: None, _copy_swa_page_table=lambda *a, **k: None)
lens = torch.tensor([1, 4, 2], dtype=torch.int32)
spec = NS(num_tokens_per_req=4, accept_length=lens, accept_length_cpu=[0, 3, 1],
          num_accepted_tokens=lens, num_accepted_tokens_cpu=[1, 4, 2],
          num_accept_tokens=lens, num_accept_tokens_cpu=[1, 4, 2])
for name, mode in (("v2", FM.DRAFT_EXTEND_V2), ("v1", FM.DRAFT_EXTEND)):
    b = backend()
    seq = torch.tensor([5, 6, 7], dtype=torch.int32)
    mha.TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph(
        b, bs=3, num_tokens=12, req_pool_indices=torch.arange(3), seq_lens=seq, encoder_lens=None,
        forward_mode=mode, spec_info=spec)
    buf = b.draft_extend_metadata[3].cu_seqlens_q
    if name == "v2":
        buf.fill_(-1)  # replay must rewrite all of it (V1 never writes [0])
    mha.TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph(
        b, bs=3, req_pool_indices=torch.arange(3), seq_lens=seq, seq_lens_sum=18, encoder_lens=None,
        forward_mode=mode, spec_info=spec, seq_lens_cpu=seq.clone())
    md = b.forward_metadata
    report[name] = [md.cu_seqlens_q.tolist(), md.cu_seqlens_q is buf, md.max_seq_len_q if name == "v2" else None]
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def other_reports(tmp_path_factory, cpu_env):
    tests_dir = str(Path(__file__).resolve().parent.parent)
    procs = {}
    for version in OTHER_TREES:
        package = copy_tree(version, tmp_path_factory.mktemp(f"mha-v2-{version}"), "package")
        result = CliRunner().invoke(main, ["apply", str(package), PATCH], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        stub_source = str(fetch_tree(VERSION))  # its maybe_stub_sgl_kernel stubs sgl_kernel
        procs[version] = subprocess.Popen(
            [sys.executable, "-c", _CHILD, tests_dir, str(package), stub_source],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
    reports = {}
    for version, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
        reports[version] = json.loads(lines[-1][len("REPORT ") :]) if proc.returncode == 0 and lines else err[-3000:]
    return reports


@pytest.mark.parametrize("version", OTHER_TREES)
def test_other_naming_generations(version, other_reports):
    report = other_reports[version]
    assert isinstance(report, dict), report
    assert report["whitelist_mha"] is True and report["whitelist_other"] is False
    assert report["v2"] == [[0, 4, 8, 12], True, 4]  # fixed stride, in place
    assert report["v1"] == [[0, 1, 5, 7], True, None]  # cumsum of the accepted counts, as before
