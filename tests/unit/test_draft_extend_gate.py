"""0.5.4 .. 0.5.9's draft-extend capture gate (patchkit.codemods.common.draft_extend_gate):
FA3 and TRT-LLM MHA join the inline ``or`` (0.5.8.post1, 0.5.9), in either
order; a worker that never replays the graph or captures it on NPU only moots
both patches; a runner with no V2 graph has no V2 top-k; TRT-LLM MLA's second
read of the mirror in its draft extend (0.5.4, 0.5.5) goes. Shapes written
here after those releases; the real trees: tests/trees/test_pre_0510.py."""

from __future__ import annotations

from patchkit.codemods import draft_extend_graph_no_topk as no_topk
from patchkit.codemods import fa3_draft_extend_graph as fa3
from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods.common.base import State
from patchkit.codemods.trtllm_mha_draft_extend_v2 import WhitelistTRTLLMHA
from patchkit.testing import apply, assert_codemod, assert_state, detect, run

HEAD = """\
_is_npu = is_npu()
_is_cuda = is_cuda()


class EagleDraftWorker(BaseDraftWorker):
    def __init__(self, server_args):
        self.speculative_algorithm = algorithm_of(server_args)
        self.hot_token_id = None

    def init_cuda_graphs(self):
        self.cuda_graph_runner_for_draft_extend = None
"""
REPLAY = """
    def draft_extend(self, batch):
        if self.cuda_graph_runner_for_draft_extend:
            return self.cuda_graph_runner_for_draft_extend.replay(batch)
"""
GATE = """\
        # Capture extend
        if self.draft_extend_attn_backend and (
            _is_npu
            or (
                _is_cuda
                and isinstance(self.draft_attn_backend, TritonMultiStepDraftBackend)
            )
        ):
            self.cuda_graph_runner_for_draft_extend = Runner(self)
"""
FA3_FLAG = """\
        # patchkit fa3-draft-extend-graph (upstream 0.5.23): FA3 has CUDA-graph
        # metadata for DRAFT_EXTEND_V2 (capture and replay), so its draft extend is
        # captured too. CUDA only, imported here: MUSA and NPU builds must not
        # import sgl_kernel. Eager with an FR-Spec token map: the graph's logits
        # buffer is not sized for its reduced head (EAGLE3's draft vocab is).
        fa3_draft_extend_graph = False
        if (
            _is_cuda
            and (self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)
        ):
            from sglang.srt.layers.attention.flashattention_backend import (
                FlashAttentionBackend,
            )

            fa3_draft_extend_graph = isinstance(
                self.draft_extend_attn_backend, FlashAttentionBackend
            )
"""
FA3_TERM = "            or fa3_draft_extend_graph\n"
MHA_TERM = """\
            or (
                _is_cuda
                and isinstance(self.draft_extend_attn_backend, TRTLLMHAAttnBackend)
            )
"""
MHA_IMPORT = "from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend\n"


def _gate(*terms: str) -> str:
    head, tail = GATE.split("        ):\n")
    return head + "".join(terms) + "        ):\n" + tail


def test_the_inline_gate_admits_fa3():
    assert_codemod(fa3.GraphCheckAdmitsFA3, HEAD + GATE + REPLAY, HEAD + FA3_FLAG + _gate(FA3_TERM) + REPLAY)


def test_the_inline_gate_admits_trtllm_mha_after_fa3():
    before = HEAD + FA3_FLAG + _gate(FA3_TERM) + REPLAY
    assert_codemod(WhitelistTRTLLMHA, before, MHA_IMPORT + HEAD + FA3_FLAG + _gate(FA3_TERM, MHA_TERM) + REPLAY)
    # and FA3 after TRT-LLM MHA: the same gate, terms in the other order
    first = apply(WhitelistTRTLLMHA, HEAD + GATE + REPLAY)
    assert apply(fa3.GraphCheckAdmitsFA3, first) == MHA_IMPORT + HEAD + FA3_FLAG + _gate(MHA_TERM, FA3_TERM) + REPLAY


def test_a_gate_that_lists_no_backends_is_missing():
    src = (
        HEAD
        + "        if has_graph(self):\n            self.cuda_graph_runner_for_draft_extend = Runner(self)\n"
        + REPLAY
    )
    assert_state(WhitelistTRTLLMHA, src, State.MISSING, "lists no backends in an `or` of isinstance checks")


def test_moot_where_the_graph_is_never_replayed_or_npu_only():
    """0.5.4.post3 captures for every backend and never replays; 0.5.5 .. 0.5.7 capture on NPU only."""
    every = (
        HEAD
        + "        if self.draft_extend_attn_backend:\n            self.cuda_graph_runner_for_draft_extend = Runner(self)\n"
    )
    npu_only = (
        HEAD
        + "        if self.draft_extend_attn_backend and _is_npu:\n            self.cuda_graph_runner_for_draft_extend = Runner(self)\n"
        + REPLAY
    )
    for codemod in (fa3.GraphCheckAdmitsFA3, WhitelistTRTLLMHA):
        never = detect(codemod, every)
        assert never.state is State.SUPERSEDED and never.moots_patch and "never replays" in never.detail
        npu = detect(codemod, npu_only)
        assert npu.state is State.SUPERSEDED and npu.moots_patch and "on NPU only" in npu.detail


RUNNER_V1 = """\
class EAGLEDraftExtendCudaGraphRunner:
    def capture_one_batch_size(self, bs):
        def run_once():
            ret = self.model_runner.forward(ForwardBatch(forward_mode=ForwardMode.DRAFT_EXTEND))  # the only mode
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
            return ret

    def replay(self, forward_batch):
        out = self.output_buffers[self.bs]
        if unpadding_bs is not None:
            out.topk_p = out.topk_p[:unpadding_bs]
            out.topk_index = out.topk_index[:unpadding_bs]
        return out
"""


def test_a_runner_without_a_v2_graph_needs_nothing():
    assert_state(no_topk.V2GraphComputesNoTopk, RUNNER_V1, State.SUPERSEDED, "never DRAFT_EXTEND_V2")


MLA = """\
class TRTLLMMLABackend(FlashInferMLAAttnBackend):
    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle() or forward_batch.forward_mode.is_draft_extend(include_v2=True):
            if getattr(forward_batch, "seq_lens_cpu", None) is not None:
                max_seq = forward_batch.seq_lens_cpu.max().item()
            else:
                max_seq = forward_batch.seq_lens.max().item()
            seq_lens = forward_batch.seq_lens
            if forward_batch.forward_mode.is_draft_extend(include_v2=True):
{}                max_seq_len_q = max(forward_batch.extend_seq_lens_cpu)
            self.metadata = make_metadata(max_seq, seq_lens)
"""
RE_READ = "                max_seq = forward_batch.seq_lens_cpu.max().item()\n"


def test_trtllm_mla_draft_extend_keeps_the_guarded_max():
    """0.5.4 / 0.5.5 read the mirror's max again in the draft extend; 0.5.6 does not."""
    # superseded once gone (as on 0.5.6+, whose pristine trees must not look half-patched)
    assert run(mla.DraftExtendReadsNoMirrorTwice, MLA.format(RE_READ)) == (State.TODO, MLA.format(""), State.SUPERSEDED)
    unguarded_first = MLA.format(RE_READ).replace('getattr(forward_batch, "seq_lens_cpu", None) is not None', "True")
    assert_state(mla.DraftExtendReadsNoMirrorTwice, unguarded_first, State.MISSING, "no None-tested max_seq")
