"""Snippet tests of tests/trees/test_draft_extend_graph_no_topk.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.codemods import draft_extend_graph_no_topk as nt
from patchkit.codemods import trtllm_mha_draft_extend_v2 as dev2
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, run_all

COMMENT = """\
            # V1 only: the DRAFT_EXTEND_V2 worker computes top-k itself on the rows it
            # selects (patchkit draft-extend-graph-no-topk, sglang #31430).
"""


HEAD = """\
from sglang.srt.model_executor.forward_batch_info import ForwardMode


class EAGLEDraftExtendCudaGraphRunner:
    def __init__(self, eagle_worker):
        self.forward_mode = ForwardMode.DRAFT_EXTEND_V2

"""


# 0.5.10 .. 0.5.12.post1: V1 and V2, softmax + fast_topk, replay copies.
CAPTURE_0512 = """\
    def capture_one_batch_size(self, bs, forward, stream_idx=0):
        def run_once():
            output_cache_loc_backup = forward_batch.out_cache_loc
            ret = self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)

            forward_batch.out_cache_loc = output_cache_loc_backup
            return ret

        return self._capture_graph(graph, pool, stream, run_once)

"""


CAPTURE_0512_AFTER = CAPTURE_0512.replace(
    """\
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    COMMENT
    + """\
            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:
                probs = torch.softmax(ret.next_token_logits, dim=-1)
                ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
)


REPLAY_0512 = """\
    def replay(self, forward_batch):
        out = self.output_buffers[bs]
        if unpadding_bs is not None:
            out_copy = out
            out = LogitsProcessorOutput(next_token_logits=out.next_token_logits[:unpadding_bs])
            out.topk_p = out_copy.topk_p[:unpadding_bs]
            out.topk_index = out_copy.topk_index[:unpadding_bs]
        return out
"""


REPLAY_GUARDED = REPLAY_0512.replace(
    """\
            out.topk_p = out_copy.topk_p[:unpadding_bs]
            out.topk_index = out_copy.topk_index[:unpadding_bs]
""",
    """\
            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:
                out.topk_p = out_copy.topk_p[:unpadding_bs]
                out.topk_index = out_copy.topk_index[:unpadding_bs]
""",
)


# 0.5.13 .. 0.5.16: argmax fast path for topk == 1 on CUDA (sglang #26235).
FAST_PATH = """\
            # ROCm's argmax tie-breaks differently.
            if self.topk == 1 and not _is_hip:
                ret.topk_index = torch.argmax(ret.next_token_logits, dim=-1, keepdim=True)
                ret.topk_p = torch.ones_like(ret.topk_index, dtype=torch.float32)
            else:
                probs = torch.softmax(ret.next_token_logits, dim=-1)
                ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
"""


CAPTURE_0513 = CAPTURE_0512.replace(
    """\
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    FAST_PATH,
)


CAPTURE_0513_AFTER = CAPTURE_0512.replace(
    """\
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    COMMENT
    + "            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:\n"
    + "".join("    " + line + "\n" for line in FAST_PATH.splitlines()),
)


# 0.5.14 .. 0.5.16: V2-only runner, capture_one_shape / execute (no top-k out).
EXECUTE = """\
    def execute(self, forward_batch):
        out = self._replay_graph(shape_key, forward_batch)
        return LogitsProcessorOutput(next_token_logits=out.next_token_logits[:num_tokens])
"""


# 0.5.17+: sglang #31430, no top-k in the graph.
CAPTURE_UPSTREAM = """\
    def capture_one_shape(self, size, forward):
        def run_once():
            ret = self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
            forward_batch.out_cache_loc = output_cache_loc_backup
            return ret

"""


def test_the_0512_runner_guards_capture_and_replay_for_v1():
    assert_codemod(
        nt.V2GraphComputesNoTopk, HEAD + CAPTURE_0512 + REPLAY_0512, HEAD + CAPTURE_0512_AFTER + REPLAY_GUARDED
    )


def test_0513_fast_path_moves_whole_under_the_guard_and_native_replay_stays():
    assert_codemod(
        nt.V2GraphComputesNoTopk, HEAD + CAPTURE_0513 + REPLAY_GUARDED, HEAD + CAPTURE_0513_AFTER + REPLAY_GUARDED
    )


def test_0514_v2_only_runner_has_a_capture_one_shape_and_an_execute_without_top_k():
    before = (
        HEAD
        + CAPTURE_0513.replace(
            "capture_one_batch_size(self, bs, forward, stream_idx=0)", "capture_one_shape(self, size, forward)"
        )
        + EXECUTE
    )
    after = (
        HEAD
        + CAPTURE_0513_AFTER.replace(
            "capture_one_batch_size(self, bs, forward, stream_idx=0)", "capture_one_shape(self, size, forward)"
        )
        + EXECUTE
    )
    assert_codemod(nt.V2GraphComputesNoTopk, before, after)


def test_upstream_top_k_free_graph_is_native_and_untouched():
    assert_state(nt.V2GraphComputesNoTopk, HEAD + CAPTURE_UPSTREAM + EXECUTE, State.DONE)


def test_a_v2_test_of_the_vendor_s_own_counts_as_done():
    vendor = CAPTURE_0512.replace(
        """\
            probs = torch.softmax(ret.next_token_logits, dim=-1)
            ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
        """\
            if not forward_batch.forward_mode.is_draft_extend_v2():
                probs = torch.softmax(ret.next_token_logits, dim=-1)
                ret.topk_p, ret.topk_index = fast_topk(probs, self.topk, dim=-1)
""",
    )
    assert_state(nt.V2GraphComputesNoTopk, HEAD + vendor + REPLAY_GUARDED, State.DONE)


@pytest.mark.parametrize("order", ["this-first", "trtllm-mha-first"])
def test_the_replay_edit_is_shared_with_trtllm_mha_draft_extend_v2(order):
    """Whichever patch comes first guards the replay; the other finds it done."""
    codemods = [nt.V2GraphComputesNoTopk, dev2.RunnerReplaySkipsTopkForV2]
    after, states = run_all(codemods if order == "this-first" else codemods[::-1], HEAD + CAPTURE_0512 + REPLAY_0512)
    assert after == HEAD + CAPTURE_0512_AFTER + REPLAY_GUARDED
    assert_state(nt.V2GraphComputesNoTopk, HEAD + CAPTURE_0512 + REPLAY_GUARDED, State.TODO)


def test_a_softmax_the_vendor_reads_elsewhere_stays_only_top_k_is_guarded():
    src = (
        HEAD
        + CAPTURE_0512.replace(
            "            ret.topk_p, ret.topk_index", "            log(probs)\n            ret.topk_p, ret.topk_index"
        )
        + REPLAY_0512
    )
    after = apply(nt.V2GraphComputesNoTopk, src)
    assert (
        "            probs = torch.softmax(ret.next_token_logits, dim=-1)\n            log(probs)\n" + COMMENT in after
    )


def test_replay_alone_still_copying_is_todo_and_fixed():
    """A graph without top-k whose replay still copies it (a V2 replay would fail)."""
    assert_codemod(
        nt.V2GraphComputesNoTopk, HEAD + CAPTURE_UPSTREAM + REPLAY_0512, HEAD + CAPTURE_UPSTREAM + REPLAY_GUARDED
    )


@pytest.mark.parametrize(
    "src, says",
    [
        (
            HEAD.replace("self.forward_mode = ForwardMode.DRAFT_EXTEND_V2", "self.mode = 2")
            + CAPTURE_0512
            + REPLAY_0512,
            "never sets self.forward_mode",
        ),
        (
            HEAD
            + CAPTURE_0512.replace(
                "            forward_batch.out_cache_loc =",
                "            log(ret)\n"
                "            ret.topk_p = ret.topk_p.float()\n"
                "            forward_batch.out_cache_loc =",
            )
            + REPLAY_0512,
            "not one run of statements that only compute it",
        ),
        (HEAD + REPLAY_0512, "defines none of capture_one_batch_size, capture_one_shape"),
        (HEAD + CAPTURE_0512, "defines none of replay, execute"),
        (
            HEAD
            + CAPTURE_0512
            + REPLAY_0512.replace("            out.topk_index", "            log(out)\n            out.topk_index"),
            "not one run of statements in one block",
        ),
    ],
)
def test_missing_anchors_are_one_line_naming_file_line_and_need(src, says):
    finding = assert_state(nt.V2GraphComputesNoTopk, src, State.MISSING, detail=says)
    assert "\n" not in finding.detail
