"""Snippet tests of tests/trees/test_flashinfer_draft_extend_graph.py (no release read;
the quick loop runs them): the worker's graph check admits FlashInfer behind the
runtime's switch; FlashInfer's capture and replay gain a DRAFT_EXTEND_V2 branch
first; fork shapes (values through locals, renamed classes, a vendor's own branch,
early returns) and upstream's forms."""

from __future__ import annotations

import pytest

from patchkit.codemods import flashinfer_draft_extend_graph as fdeg
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, detect, run

WORKER = "srt/speculative/eagle_worker_v2.py"
BACKEND = "srt/layers/attention/flashinfer_backend.py"
IMPORT = "from sglang.srt._patchkit.backends.flashinfer_draft_extend_graph import {}\n"

# --- the worker ------------------------------------------------------------------------

HEAD = """\
_is_cuda = is_cuda()


class EagleDraftWorker(BaseDraftWorker):
    def __init__(self, server_args):
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)

    def init_token_map(self):
        self.hot_token_id = None

    def init_cuda_graphs(self):
"""
OR_CHAIN = """\
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
        )
"""
LET_IN = """\
        if (
            _is_cuda
            and not supports_cuda_draft_extend_graph
            and (self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)
        ):
            # patchkit flashinfer-draft-extend-graph (upstream 0.5.14): FlashInfer captures
            # its DRAFT_EXTEND_V2 metadata and replays it planned from the CPU mirror.
            # Off unless PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1 (no GPU comparison yet);
            # CUDA only; eager with an FR-Spec token map (the graph's logits buffer).
            supports_cuda_draft_extend_graph = admits_flashinfer_draft_extend(
                self.draft_extend_attn_backend
            )
"""
TAIL = """\
        # Capture extend
        if self.draft_extend_attn_backend and supports_cuda_draft_extend_graph:
            pass
"""


def worker(check: str, let_in: str = "") -> str:
    return HEAD + check + let_in + TAIL


def test_flashinfer_is_let_in_after_the_check_behind_the_runtimes_switch():
    after = IMPORT.format("admits_flashinfer_draft_extend") + worker(OR_CHAIN, LET_IN)
    assert_codemod(fdeg.GraphCheckAdmitsFlashInfer, worker(OR_CHAIN), after)


UPSTREAM_TUPLE = """\
        graph_supported_backend = isinstance(
            self.draft_extend_attn_backend,
            (TritonAttnBackend, TRTLLMMLABackend, TRTLLMHAAttnBackend, FlashInferAttnBackend),
        )
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and graph_supported_backend
"""
UPSTREAM_LIST = """\
        graph_supported_backend_types = [TritonAttnBackend, FlashInferAttnBackend]
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and isinstance(
            self.draft_extend_attn_backend, tuple(graph_supported_backend_types)
        )
"""
VENDOR_APPEND = """\
        kinds = [TritonAttnBackend]
        if _is_cuda:
            kinds.append(FlashInferAttnBackend)
        supports_cuda_draft_extend_graph = isinstance(self.draft_extend_attn_backend, tuple(kinds))
"""


@pytest.mark.parametrize(
    "form", [UPSTREAM_TUPLE, UPSTREAM_LIST, VENDOR_APPEND], ids=["0.5.14-tuple", "0.5.15-list", "vendor-append"]
)
def test_a_check_that_already_lists_flashinfer_is_done_and_untouched(form):
    assert_state(fdeg.GraphCheckAdmitsFlashInfer, worker(form), State.DONE)


def test_our_check_is_done_the_second_time():
    state, out, after = run(fdeg.GraphCheckAdmitsFlashInfer, worker(OR_CHAIN))
    assert (state, after) == (State.TODO, State.DONE) and out.count("admits_flashinfer_draft_extend(") == 1


def test_a_worker_without_the_cuda_flag_is_refused_in_one_line():
    src = worker(OR_CHAIN).replace("_is_cuda = is_cuda()", "_on_gpu = is_cuda()")
    finding = detect(fdeg.GraphCheckAdmitsFlashInfer, src, filename=WORKER)
    assert finding.state is State.MISSING and "defines no `_is_cuda`" in finding.detail


INLINE_GATE = """\
        if self.draft_extend_attn_backend and (
            _is_npu
            or (_is_cuda and isinstance(self.draft_attn_backend, TritonMultiStepDraftBackend))
        ):
            self.cuda_graph_runner_for_draft_extend = Runner(self)

    def forward(self, batch):
        return self.cuda_graph_runner_for_draft_extend.can_run(batch)
"""


def test_0_5_9s_inline_gate_gets_a_flag_and_one_more_term():
    state, out, after = run(fdeg.GraphCheckAdmitsFlashInfer, HEAD + INLINE_GATE)
    assert (state, after) == (State.TODO, State.DONE)
    assert "flashinfer_draft_extend_graph = (\n            _is_cuda\n" in out
    assert "and admits_flashinfer_draft_extend(self.draft_extend_attn_backend)\n" in out
    assert "            or flashinfer_draft_extend_graph\n        ):" in out


# --- the backend ---------------------------------------------------------------------------

CAPTURE = """\
class FlashInferAttnBackend(AttentionBackend):
    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        if forward_mode.is_decode_or_idle():
            self.forward_metadata = DecodeMetadata([])
        elif forward_mode.is_target_verify():
            prefill_wrappers = [
                BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace_buffer, "NHD", use_cuda_graph=True, qo_indptr_buf=self.qo[: bs + 1]
                )
            ]
            self.prefill_cuda_graph_metadata[bs] = prefill_wrappers
            self.forward_metadata = PrefillMetadata(prefill_wrappers, False, False)
        else:
            raise ValueError(f"Invalid mode: {forward_mode=}")
"""
CAPTURE_BRANCH = """\
        if forward_mode.is_draft_extend_v2():
            # patchkit flashinfer-draft-extend-graph (upstream 0.5.14): the spec-v2 draft
            # extend as a causal paged prefill at the graph's fixed query width; its
            # replay plans from the CPU mirror without reading the device back.
            self.forward_metadata = capture_draft_extend_v2(
                self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens,
                {wrapper}, {metadata},
            )
            return
"""
SIGNATURE_END = "forward_mode, spec_info\n    ):\n"


def with_branch(src: str, branch: str) -> str:
    head, _, tail = src.partition(SIGNATURE_END)
    return head + SIGNATURE_END + branch + tail


def test_the_capture_gets_a_draft_extend_v2_branch_first():
    branch = CAPTURE_BRANCH.format(wrapper="BatchPrefillWithPagedKVCacheWrapper", metadata="PrefillMetadata")
    after = IMPORT.format("capture_draft_extend_v2") + with_branch(CAPTURE, branch)
    assert_codemod(fdeg.CapturesDraftExtendV2, CAPTURE, after)


def test_renamed_classes_are_taken_from_the_releases_own_graph_branch():
    """A fork that imports the wrapper under another name and names its metadata
    class its own way: the branch hands the runtime those names."""
    fork = CAPTURE.replace("BatchPrefillWithPagedKVCacheWrapper(", "fi_prefill.PagedPrefill(").replace(
        "PrefillMetadata(", "ForkPrefillMeta("
    )
    state, out, after = run(fdeg.CapturesDraftExtendV2, fork)
    assert (state, after) == (State.TODO, State.DONE)
    assert "        fi_prefill.PagedPrefill, ForkPrefillMeta,\n" in out


def test_values_through_locals_and_an_early_return_leave_the_branch_first():
    """A fork that reads the mode through a local and returns early from its decode
    branch: the V2 branch is put first, before either, and reads the parameters."""
    fork = CAPTURE.replace(
        "        if forward_mode.is_decode_or_idle():\n            self.forward_metadata = DecodeMetadata([])\n",
        "        mode = forward_mode\n        if mode.is_decode_or_idle():\n"
        "            self.forward_metadata = DecodeMetadata([])\n            return\n        if mode.is_idle():\n"
        "            return\n",
    ).replace("        elif forward_mode.is_target_verify():", "        elif mode.is_target_verify():")
    state, out, after = run(fdeg.CapturesDraftExtendV2, fork)
    assert (state, after) == (State.TODO, State.DONE)
    body = out.split(SIGNATURE_END, 1)[1]
    assert (
        body.startswith("        if forward_mode.is_draft_extend_v2():\n") and "        mode = forward_mode\n" in body
    )


VENDOR_CAPTURE = CAPTURE.replace(
    "        else:\n",
    "        elif forward_mode.is_draft_extend(include_v2=True):\n"
    "            self.draft_extend_cuda_graph_metadata[bs] = self.make_wrappers(bs)\n"
    "        else:\n",
)


def test_a_vendors_own_v2_branch_is_left_as_it_is():
    finding = assert_state(fdeg.CapturesDraftExtendV2, VENDOR_CAPTURE, State.SUPERSEDED)
    assert "handles DRAFT_EXTEND_V2 in a CUDA graph itself" in finding.detail


def test_a_capture_without_a_graph_prefill_branch_is_refused_in_one_line():
    src = CAPTURE.replace("qo_indptr_buf=", "qo_buf=")
    finding = detect(fdeg.CapturesDraftExtendV2, src, filename=BACKEND)
    assert finding.state is State.MISSING and f"{BACKEND}:" in finding.detail
    assert "builds a wrapper on qo_indptr_buf=" in finding.detail


def test_renamed_parameters_are_refused_in_one_line():
    src = CAPTURE.replace("num_tokens, req_pool_indices", "n_tokens, req_pool_indices")
    finding = detect(fdeg.CapturesDraftExtendV2, src, filename=BACKEND)
    assert finding.state is State.MISSING and "no parameter num_tokens" in finding.detail


REPLAY = """\
class FlashInferAttnBackend(AttentionBackend):
    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        \"\"\"Re-plan the captured wrappers.\"\"\"
        if forward_mode.is_decode_or_idle():
            pass
        else:
            raise ValueError("Invalid forward mode")
"""
REPLAY_BRANCH = """\
        if forward_mode.is_draft_extend_v2():
            # patchkit flashinfer-draft-extend-graph (upstream 0.5.14): the draft-extend
            # graph's plan from the CPU mirror (the stock plan where it does not match).
            replay_draft_extend_v2(
                self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, seq_lens_cpu
            )
            return
"""


def test_the_replay_gets_its_branch_after_the_docstring():
    docstring = '        """Re-plan the captured wrappers."""\n'
    after = IMPORT.format("replay_draft_extend_v2") + REPLAY.replace(docstring, docstring + REPLAY_BRANCH)
    assert_codemod(fdeg.ReplaysDraftExtendV2, REPLAY, after)


def test_a_vendors_own_replay_branch_is_left_as_it_is():
    own = REPLAY.replace(
        "        else:\n",
        "        elif forward_mode.is_draft_extend_v2():\n"
        "            wrappers = self.draft_extend_cuda_graph_metadata[bs]\n"
        "        else:\n",
    )
    assert_state(fdeg.ReplaysDraftExtendV2, own, State.SUPERSEDED)


UPSTREAM_0_5_14 = """\
class FlashInferAttnBackend(AttentionBackend):
    def _prepare_cuda_graph_metadata(self, bs, num_tokens, forward_mode, spec_info):
        if forward_mode.is_draft_extend_v2():
            prefill_wrappers = self._create_prefill_wrappers(bs, use_custom_mask=False)
            self.draft_extend_cuda_graph_metadata[bs] = prefill_wrappers

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        if forward_batch.forward_mode.is_draft_extend_v2():
            wrappers = self.draft_extend_cuda_graph_metadata[forward_batch.batch_size]
"""
UPSTREAM_0_5_13 = """\
class FlashInferAttnBackend(AttentionBackend):
    def _prepare_cuda_graph_metadata(self, bs, num_tokens, forward_mode, spec_info):
        if forward_mode.is_target_verify():
            self.prefill_cuda_graph_metadata[bs] = []
"""


@pytest.mark.parametrize("codemod", [fdeg.CapturesDraftExtendV2, fdeg.ReplaysDraftExtendV2])
def test_0_5_14s_one_body_is_native_0_5_13s_is_not_carried(codemod):
    assert_state(codemod, UPSTREAM_0_5_14, State.DONE)
    finding = assert_state(codemod, UPSTREAM_0_5_13, State.SUPERSEDED)
    assert finding.moots_patch and "not carried onto 0.5.13.x" in finding.detail
