"""draft-extend-graph-no-topk on CPU: the real ``EAGLEDraftExtendCudaGraphRunner``
of 0.5.12.post1, pristine and patched, captures one batch size with a stub
draft model; the graph "capture" runs ``run_once`` eagerly, so what it
computes is what a captured graph would replay.

* patched, DRAFT_EXTEND_V2: no softmax, no top-k, no top-k fields on the
  output; logits and hidden states as before;
* patched, DRAFT_EXTEND (V1): softmax + top-k as pristine, same values;
* pristine, V2: computes them (the waste the patch removes).
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
BS, STEPS, VOCAB, HIDDEN, TOPK = 2, 3, 11, 4, 2
TOKENS = BS * (STEPS + 1)


def runner_module(load_sglang, tmp_path_factory, patched: bool):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("patched" if patched else "pristine"), "package")
    if patched:
        result = CliRunner().invoke(main, ["apply", str(package), "draft-extend-graph-no-topk"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    return importlib.import_module("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner")


class Model:
    """The draft model: fixed logits for every token row, counted calls."""

    def __init__(self, lp):
        self.lp, self.calls = lp, 0
        self.logits = torch.randn(TOKENS, VOCAB, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, positions, forward_batch):
        self.calls += 1
        rows = input_ids.shape[0] if forward_batch.forward_mode.is_draft_extend_v2() else forward_batch.batch_size
        return self.lp.LogitsProcessorOutput(
            next_token_logits=self.logits[:rows].clone(), hidden_states=torch.ones(rows, HIDDEN)
        )


def capture(mod, mode, monkeypatch):
    """One batch size captured by the real capture_one_batch_size; returns
    (output, softmax calls, top-k calls)."""
    lp = importlib.import_module("sglang.srt.layers.logits_processor")
    calls = {"softmax": 0, "topk": 0}
    real_softmax, real_topk = torch.softmax, mod.fast_topk

    def softmax(*a, **k):
        calls["softmax"] += 1
        return real_softmax(*a, **k)

    def topk(*a, **k):
        calls["topk"] += 1
        return real_topk(*a, **k)

    monkeypatch.setattr(torch, "softmax", softmax)
    monkeypatch.setattr(mod, "fast_topk", topk)
    i64 = dict(dtype=torch.int64)
    buffers = NS(
        input_ids=torch.zeros(TOKENS, **i64),
        req_pool_indices=torch.zeros(BS, **i64),
        seq_lens=torch.full((BS,), 8, dtype=torch.int32),
        seq_lens_cpu=torch.full((BS,), 8, dtype=torch.int32),
        extend_seq_lens=torch.full((BS,), STEPS + 1, dtype=torch.int32),
        out_cache_loc=torch.zeros(TOKENS, **i64),
        positions=torch.zeros(TOKENS, **i64),
        mrope_positions=torch.zeros(3, TOKENS, **i64),
        hidden_states=torch.zeros(TOKENS, HIDDEN),
        num_correct_drafts=torch.zeros(BS, dtype=torch.int32),
        num_accept_tokens=torch.zeros(BS, dtype=torch.int32),
        next_token_logits_buffer=torch.zeros(TOKENS, VOCAB),
        global_num_tokens_gpu=None,
        global_num_tokens_for_logprob_gpu=None,
    )
    runner = object.__new__(mod.EAGLEDraftExtendCudaGraphRunner)
    model = Model(lp)
    runner.__dict__.update(
        buffers=buffers,
        stream=None,
        num_tokens_per_bs=STEPS + 1,
        extend_seq_lens_cpu=[STEPS + 1] * BS,
        forward_mode=mode,
        require_mlp_tp_gather=False,
        require_attn_tp_gather=False,
        topk=TOPK,
        padded_static_len=-1,
        deepep_adapter=NS(capture=lambda **k: None),
        model_runner=NS(req_to_token_pool=None, token_to_kv_pool=None, spec_algorithm=None, model=model),
        draft_extend_attn_backend=NS(init_forward_metadata_capture_cuda_graph=lambda **k: None),
        _create_graph=lambda: NS(pool=lambda: None),
        _capture_init=lambda run_once: None,
        _capture_graph=lambda graph, pool, stream, run_once: run_once(),
    )
    _graph, out = runner.capture_one_batch_size(BS, forward=None)
    assert model.calls == 1
    return out, model.logits, calls


@pytest.fixture(scope="module")
def patched(load_sglang, tmp_path_factory):
    return runner_module(load_sglang, tmp_path_factory, patched=True)


def test_patched_v2_graph_computes_no_softmax_no_top_k(patched, monkeypatch):
    out, logits, calls = capture(patched, patched.ForwardMode.DRAFT_EXTEND_V2, monkeypatch)
    assert calls == {"softmax": 0, "topk": 0}
    assert not hasattr(out, "topk_p") and not hasattr(out, "topk_index")
    assert torch.equal(out.next_token_logits, logits) and out.hidden_states.shape == (TOKENS, HIDDEN)


def test_patched_v1_graph_still_computes_top_k(patched, monkeypatch):
    out, logits, calls = capture(patched, patched.ForwardMode.DRAFT_EXTEND, monkeypatch)
    assert calls == {"softmax": 1, "topk": 1}
    expected_p, expected_i = torch.topk(torch.softmax(logits[:BS], dim=-1), TOPK, dim=-1)
    assert torch.equal(out.topk_index, expected_i) and torch.allclose(out.topk_p, expected_p)


def test_pristine_v2_graph_computes_the_top_k_it_throws_away(load_sglang, tmp_path_factory, monkeypatch):
    pristine = runner_module(load_sglang, tmp_path_factory, patched=False)
    out, logits, calls = capture(pristine, pristine.ForwardMode.DRAFT_EXTEND_V2, monkeypatch)
    assert calls == {"softmax": 1, "topk": 1} and out.topk_p.shape == (TOKENS, TOPK)
