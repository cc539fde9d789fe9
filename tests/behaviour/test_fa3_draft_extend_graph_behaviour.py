"""fa3-draft-extend-graph on CPU: 0.5.12.post1 with every patch applied,
imported for real.

* the worker's real ``init_cuda_graphs`` captures the draft-extend graph for
  FA3 on CUDA, and not on MUSA (FA3's MUSA subclass), not with a speculative
  token map, not for a backend the check leaves out; Triton's decision is
  unchanged; the pristine worker leaves FA3 eager (the gap the patch closes);
* what the captured graph then replays: FA3's DRAFT_EXTEND_V2 capture and
  replay metadata, with the CPU mirror (tight page table, as without
  fa3-spec-v2) and without it (fa3-spec-v2's static bound), both covering
  every live page.
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
CTX = 64
NUM_DRAFT = 4
MAX_BS = 4
REQ_TO_TOKEN = torch.arange(8 * (CTX + 4), dtype=torch.int32).reshape(8, CTX + 4) + 1000
SEQ_LENS = torch.tensor([5, 9])
POOL = torch.tensor([3, 1])


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("fa3-graph"), "package")
    result = CliRunner().invoke(main, ["apply", str(package)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture(scope="module")
def worker_module(sglang):
    return importlib.import_module("sglang.srt.speculative.eagle_worker_v2")


@pytest.fixture(scope="module")
def fa(sglang):
    return importlib.import_module("sglang.srt.layers.attention.flashattention_backend")


@pytest.fixture(scope="module")
def modes(sglang):
    return importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode


@pytest.fixture
def capture(worker_module, monkeypatch):
    """Run the real ``EagleDraftWorker.init_cuda_graphs`` on a stand-in worker
    (``on``: the device flags), the graph runners replaced by recorders."""
    monkeypatch.setattr(
        worker_module, "EAGLEDraftExtendCudaGraphRunner", lambda w: ("graph", w.draft_extend_attn_backend)
    )
    monkeypatch.setattr(worker_module, "EAGLEDraftCudaGraphRunner", lambda w: ("graph", w.draft_extend_attn_backend))
    monkeypatch.setattr(worker_module, "get_available_gpu_memory", lambda *a, **k: 0.0)

    def run(backend, on="cuda", hot_token_id=None, algorithm="EAGLE", me=None):
        for flag in ("_is_cuda", "_is_musa", "_is_hip", "_is_npu"):
            monkeypatch.setattr(worker_module, flag, flag == f"_is_{on}")
        me = me or NS(hot_token_id=hot_token_id)
        me.__dict__.update(
            server_args=NS(disable_cuda_graph=False, model_impl="auto"),
            speculative_num_steps=1,
            draft_extend_attn_backend=backend,
            draft_attn_backend=None,
            speculative_algorithm=worker_module.SpeculativeAlgorithm.from_string(algorithm),
            target_worker=NS(device=on),
            device="cpu",
            gpu_id=0,
        )
        worker_module.EagleDraftWorker.init_cuda_graphs(me)
        return me.cuda_graph_runner_for_draft_extend is not None

    return run


def bare(cls):
    """An instance for isinstance checks only (its __init__ needs a model runner)."""
    return object.__new__(cls)


def test_fa3_draft_extend_is_captured_on_cuda(capture, fa):
    assert capture(bare(fa.FlashAttentionBackend)) is True


def test_musa_keeps_fa3_eager_as_upstream(capture, fa):
    # MUSA's backend subclasses FA3 (its module needs the MUSA flash_attn
    # package, so a subclass stands in for it here).
    class MusaFlashAttentionBackend(fa.FlashAttentionBackend):
        pass

    assert capture(bare(MusaFlashAttentionBackend), on="musa") is False
    assert capture(bare(MusaFlashAttentionBackend), on="cuda") is True


def test_a_speculative_token_map_keeps_fa3_eager(capture, fa):
    """FR-Spec (EAGLE / STANDALONE with speculative_token_map): the runner's
    logits buffer is not sized for its reduced head."""
    assert capture(bare(fa.FlashAttentionBackend), hot_token_id=torch.arange(8)) is False
    assert capture(bare(fa.FlashAttentionBackend), hot_token_id=torch.arange(8), algorithm="STANDALONE") is False


def test_an_eagle3_draft_with_a_reduced_vocab_is_captured(capture, fa, sglang, worker_module):
    """A published EAGLE3 checkpoint's shape: draft_vocab_size 32000 < the
    target's, with a d2t map. The real draft model's load_weights turns d2t
    into hot_token_id, the real init_lm_head hands it to the worker, and the
    real graph check then captures FA3's draft extend."""
    eagle3 = importlib.import_module("sglang.srt.models.llama_eagle3").LlamaForCausalLMEagle3
    draft = object.__new__(eagle3)
    torch.nn.Module.__init__(draft)
    draft.hot_token_id = None
    d2t = torch.randint(0, 96_000, (32_000,))  # offsets: target id = draft id + d2t[draft id]
    draft.load_weights([("d2t", d2t)])
    assert draft.hot_token_id is not None and draft.hot_token_id.shape == (32_000,)
    draft.set_embed = lambda embed: None  # a stand-in for the embedding the target shares
    head = torch.zeros(128_256, 8)
    me = NS(
        hot_token_id=None,
        draft_runner=NS(model=draft),
        speculative_algorithm=worker_module.SpeculativeAlgorithm.from_string("EAGLE3"),
        target_worker=NS(model_runner=NS(model=NS(get_embed_and_head=lambda: (head, head)))),
    )
    worker_module.EagleDraftWorker.init_lm_head(me)
    assert torch.equal(me.hot_token_id, d2t + torch.arange(32_000))
    assert capture(bare(fa.FlashAttentionBackend), algorithm="EAGLE3", me=me) is True


def test_other_decisions_are_unchanged(capture, sglang):
    triton = importlib.import_module("sglang.srt.layers.attention.triton_backend").TritonAttnBackend
    flashinfer = importlib.import_module("sglang.srt.layers.attention.flashinfer_backend").FlashInferAttnBackend
    assert capture(bare(triton)) is True
    assert capture(bare(triton), hot_token_id=torch.arange(8)) is True  # not this patch's business
    assert capture(bare(flashinfer)) is False
    assert capture(None) is False


def test_the_pristine_worker_leaves_fa3_eager():
    """The gap, read off the release: its graph check never names FA3."""
    from patchkit.fetch import fetch_tree

    text = (fetch_tree(VERSION) / "srt/speculative/eagle_worker_v2.py").read_text()
    check = text[text.index("supports_cuda_draft_extend_graph = ") : text.index("# Capture extend")]
    assert "FlashAttentionBackend" not in check and "TritonAttnBackend" in check


# --- what the captured draft extend replays ----------------------------------------------


def model_runner():
    config = NS(
        is_encoder_decoder=False,
        context_len=CTX,
        attention_arch=None,
        is_local_attention_model=False,
        head_dim=64,
        hf_text_config=NS(num_attention_heads=8),
        get_num_kv_heads=lambda tp: 2,
    )
    server_args = NS(
        kv_cache_dtype="auto",
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=NUM_DRAFT,
        enable_deterministic_inference=False,
        disable_cuda_graph=False,
        is_embedding=False,
        chunked_prefill_size=8192,
        disable_radix_cache=False,
        enable_dp_attention=False,
    )
    return NS(
        sliding_window_size=None,
        model_config=config,
        device="cpu",
        req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN),
        kv_cache_dtype=torch.bfloat16,
        server_args=server_args,
        page_size=1,
        attn_cp_size=1,
        token_to_kv_pool=object(),
        tp_size=1,
        is_draft_worker=True,
    )


def captured_draft_extend(fa, modes):
    """A draft-extend backend (skip_prefill=False, as the worker makes it) with
    a bs-2 DRAFT_EXTEND_V2 graph captured."""
    b = fa.FlashAttentionBackend(model_runner(), skip_prefill=False)
    b.init_cuda_graph_state(MAX_BS, MAX_BS * NUM_DRAFT)
    b.init_forward_metadata_capture_cuda_graph(
        2,
        2 * NUM_DRAFT,
        torch.zeros(2, dtype=torch.int64),
        torch.ones(2, dtype=torch.int64),
        None,
        modes.DRAFT_EXTEND_V2,
        NS(num_tokens_per_req=NUM_DRAFT),
    )
    return b


@pytest.mark.parametrize("mirror", [True, False], ids=["with-mirror", "without-mirror"])
def test_draft_extend_v2_replay_with_and_without_the_mirror(fa, modes, mirror):
    b = captured_draft_extend(fa, modes)
    md = b.draft_extend_metadata[2]
    md.page_table.fill_(-1)  # what earlier batches left
    spec = NS(num_tokens_per_req=NUM_DRAFT, extend_seq_lens_tensor=None, extend_seq_lens_cpu=None)
    b.init_forward_metadata_replay_cuda_graph(
        2, POOL, SEQ_LENS, None, None, modes.DRAFT_EXTEND_V2, spec, seq_lens_cpu=SEQ_LENS.clone() if mirror else None
    )
    assert md.cache_seqlens_int32.tolist() == SEQ_LENS.tolist()
    assert md.cu_seqlens_k.tolist() == [0, 5, 14]
    assert md.cu_seqlens_q.tolist() == [0, NUM_DRAFT, 2 * NUM_DRAFT]  # the fixed-stride q layout the graph has
    width = 9 if mirror else CTX  # tight with the mirror; the static bound without it
    assert md.max_seq_len_k == width
    # The table itself is built on the device, each row to its own length
    # (fa3-spec-v2's device build), mirror or not.
    for row, n in enumerate(SEQ_LENS.tolist()):
        assert (md.page_table[row, :n] == REQ_TO_TOKEN[POOL[row], :n]).all()
        assert (md.page_table[row, n:] == -1).all()
