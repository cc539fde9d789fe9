"""Snippet tests of tests/trees/test_trtllm_mha_draft_extend_v2.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import libcst as cst
import pytest

from patchkit.codemods import trtllm_mha_draft_extend_v2 as dev2
from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect, run, run_all

WORKER_PRE = """
from sglang.srt.environ import envs
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.attention.trtllm_mla_backend import (
    TRTLLMMLABackend,
)
from sglang.srt.layers.dp_attention import get_attention_tp_group


class EagleDraftWorker(BaseDraftWorker):
    def init_cuda_graphs(self):
        supports_hip_aiter_draft_extend_graph = False

        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
        )
        # Capture extend
        if self.draft_extend_attn_backend and supports_cuda_draft_extend_graph:
            pass
"""


WORKER_POST = """
from sglang.srt.environ import envs
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
from sglang.srt.layers.attention.trtllm_mla_backend import (
    TRTLLMMLABackend,
)
from sglang.srt.layers.dp_attention import get_attention_tp_group


class EagleDraftWorker(BaseDraftWorker):
    def init_cuda_graphs(self):
        supports_hip_aiter_draft_extend_graph = False

        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and isinstance(
            self.draft_extend_attn_backend,
            (
                TritonAttnBackend,
                TRTLLMMLABackend,
                TRTLLMHAAttnBackend,
            ),
        )
        # Capture extend
        if self.draft_extend_attn_backend and supports_cuda_draft_extend_graph:
            pass
"""


def test_whitelist_chain_becomes_one_tuple_and_import_sits_with_the_backends():
    assert_codemod(dev2.WhitelistTRTLLMHA, WORKER_PRE, WORKER_POST)


def test_whitelist_fork_shapes():
    # 0.5.10 shape (`_is_cuda and (...)`), one line, already a tuple: still one tuple.
    src = WORKER_PRE.replace(
        """(_is_cuda or _is_musa) and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
        )""",
        "_is_cuda and isinstance(self.draft_extend_attn_backend, (TritonAttnBackend, TRTLLMMLABackend))",
    )
    before, after, again = run(dev2.WhitelistTRTLLMHA, src)
    assert (before, again) == (State.TODO, State.DONE)
    assert "supports_cuda_draft_extend_graph = _is_cuda and isinstance(\n" in after
    assert primitives.isinstance_class_names(
        cst.parse_expression(after.split(" = _is_cuda and ")[1].split("\n        #")[0])
    ) == (
        "self.draft_extend_attn_backend",
        ["TritonAttnBackend", "TRTLLMMLABackend", "TRTLLMHAAttnBackend"],
    )
    # Whitelisted (a fork's own chained form) but the import is missing: only the import is added.
    chained = WORKER_PRE.replace(
        "or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)",
        "or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)\n"
        "            or isinstance(self.draft_extend_attn_backend, TRTLLMHAAttnBackend)",
    )
    before, after, again = run(dev2.WhitelistTRTLLMHA, chained)
    assert (before, again) == (State.TODO, State.DONE)
    assert after.count("TRTLLMHAAttnBackend") == 2 and "import TRTLLMHAAttnBackend" in after
    assert "or isinstance(self.draft_extend_attn_backend, TRTLLMHAAttnBackend)" in after


UPSTREAM_0_5_13_WORKER = """
from sglang.srt.layers.attention.tokenspeed_mla_backend import TokenspeedMLABackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend


class EagleDraftWorker(BaseDraftWorker):
    def init_cuda_graphs(self):
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and isinstance(
            self.draft_extend_attn_backend,
            (
                TritonAttnBackend,
                TRTLLMMLABackend,
                TRTLLMHAAttnBackend,
                TokenspeedMLABackend,
            ),
        )
"""


UPSTREAM_0_5_17_WORKER = """
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend


class EagleDraftWorker(EagleDraftWorkerBase):
    def init_cuda_graphs(self):
        self._capture_cuda_graphs()

    def _capture_cuda_graphs(self):
        graph_supported_backend_types = [
            TritonAttnBackend,
            TRTLLMHAAttnBackend,
        ]
        graph_supported_backend = isinstance(
            self.draft_extend_attn_backend,
            tuple(graph_supported_backend_types),
        )
        supports_cuda_draft_extend_graph = (
            _is_cuda or _is_musa
        ) and graph_supported_backend
"""


@pytest.mark.parametrize("src", [UPSTREAM_0_5_13_WORKER, UPSTREAM_0_5_17_WORKER], ids=["0.5.13", "0.5.17"])
def test_whitelist_upstream_shapes_are_done(src):
    assert_state(dev2.WhitelistTRTLLMHA, src, State.DONE)


@pytest.mark.parametrize(
    "src",
    [
        "class EagleDraftWorker:\n    def init_cuda_graphs(self):\n        pass\n",
        "class EagleDraftWorker:\n    def init_cuda_graphs(self):\n        supports_cuda_draft_extend_graph = _is_cuda\n",
        "class Other:\n    pass\n",
    ],
    ids=["no-whitelist", "not-isinstance", "no-class"],
)
def test_whitelist_missing_anchor(src):
    assert_state(dev2.WhitelistTRTLLMHA, src, State.MISSING)


MHA_PRE = '''
from __future__ import annotations

"""Module text."""

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        metadata = TRTLLMMHAMetadata()
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend():
            num_tokens_per_bs = num_tokens // bs
            metadata.max_seq_len_q = num_tokens_per_bs
            self.draft_extend_metadata[bs] = metadata
        self.forward_metadata = metadata

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        metadata = None
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend():
            metadata = self.draft_extend_metadata[bs]
            metadata.cache_seqlens_int32.copy_(seq_lens)
            extend_lens = spec_info.num_accept_tokens[:bs]
            if spec_info.num_accept_tokens_cpu:
                metadata.max_seq_len_q = max(spec_info.num_accept_tokens_cpu)
            else:
                metadata.max_seq_len_q = 1

            metadata.cu_seqlens_q[1:].copy_(
                torch.cumsum(extend_lens, dim=0, dtype=torch.int32)
            )

            max_seq_pages = (metadata.max_seq_len_k + self.page_size - 1) // self.page_size
        self.forward_metadata = metadata
'''


MHA_POST = '''
from __future__ import annotations

"""Module text."""

import torch

from sglang.srt._patchkit.backends.trtllm_mha import fill_draft_extend_v2_cu_seqlens_q
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        metadata = TRTLLMMHAMetadata()
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend(include_v2=True):
            num_tokens_per_bs = num_tokens // bs
            metadata.max_seq_len_q = num_tokens_per_bs
            self.draft_extend_metadata[bs] = metadata
        self.forward_metadata = metadata

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        metadata = None
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend(include_v2=True):
            metadata = self.draft_extend_metadata[bs]
            metadata.cache_seqlens_int32.copy_(seq_lens)
            if forward_mode.is_draft_extend_v2():
                # DRAFT_EXTEND_V2: every request has spec_info.num_tokens_per_req
                # query tokens (a fixed stride); filled in place, no host sync.
                fill_draft_extend_v2_cu_seqlens_q(metadata, spec_info, bs)
            else:
                extend_lens = spec_info.num_accept_tokens[:bs]
                if spec_info.num_accept_tokens_cpu:
                    metadata.max_seq_len_q = max(spec_info.num_accept_tokens_cpu)
                else:
                    metadata.max_seq_len_q = 1

                metadata.cu_seqlens_q[1:].copy_(
                    torch.cumsum(extend_lens, dim=0, dtype=torch.int32)
                )

            max_seq_pages = (metadata.max_seq_len_k + self.page_size - 1) // self.page_size
        self.forward_metadata = metadata
'''


MHA_CODEMODS = [dev2.CaptureIncludesDraftExtendV2, dev2.ReplayDraftExtendV2Stride]


def test_mha_capture_and_replay_v2_branch():
    after, states = run_all(MHA_CODEMODS, MHA_PRE)
    assert states == [State.DONE, State.DONE]
    assert after == code(MHA_POST)
    again, _ = run_all(MHA_CODEMODS, MHA_POST)
    assert again == code(MHA_POST)


def test_mha_each_codemod_alone():
    before, after, again = run(dev2.CaptureIncludesDraftExtendV2, MHA_PRE)
    assert (before, again) == (State.TODO, State.DONE)
    assert after.count("is_draft_extend(include_v2=True)") == 1  # only the capture branch
    before, after, again = run(dev2.ReplayDraftExtendV2Stride, MHA_PRE)
    assert (before, again) == (State.TODO, State.DONE)
    assert after.count("is_draft_extend(include_v2=True)") == 1  # only the replay branch
    assert "from sglang.srt._patchkit.backends.trtllm_mha import fill_draft_extend_v2_cu_seqlens_q\n" in after


def test_mha_draft_extend_test_in_a_fork_s_own_condition():
    # A fork that tests more than the mode: the branch is found by the call, and
    # only the call changes; the fork's terms stay.
    src = MHA_PRE.replace(
        "elif forward_mode.is_draft_extend():",
        "elif (forward_mode.is_draft_extend() and self.vendor_graphs_enabled):",
    )
    after, states = run_all(MHA_CODEMODS, src)
    assert states == [State.DONE, State.DONE]
    assert after == code(MHA_POST).replace(
        "elif forward_mode.is_draft_extend(include_v2=True):",
        "elif (forward_mode.is_draft_extend(include_v2=True) and self.vendor_graphs_enabled):",
    )
    # A negated test is not the draft-extend branch.
    negated = MHA_PRE.replace("elif forward_mode.is_draft_extend():", "elif not forward_mode.is_draft_extend():")
    assert_state(dev2.CaptureIncludesDraftExtendV2, negated, State.MISSING, detail="no draft-extend branch")


def test_mha_renamed_methods_0_5_13_pre_change_shape():
    src = MHA_PRE.replace("init_forward_metadata_capture_cuda_graph", "_build_cuda_graph_metadata").replace(
        "init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata"
    )
    after, states = run_all(MHA_CODEMODS, src)
    assert states == [State.DONE, State.DONE]
    assert after == code(MHA_POST).replace(
        "init_forward_metadata_capture_cuda_graph", "_build_cuda_graph_metadata"
    ).replace("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")


def test_mha_partial_include_v2_without_stride_path():
    # The closed first attempt (sglang #25791) only flipped include_v2=True.
    src = MHA_PRE.replace("is_draft_extend()", "is_draft_extend(include_v2=True)")
    assert_state(dev2.CaptureIncludesDraftExtendV2, src, State.DONE)
    after, states = run_all(MHA_CODEMODS, src)
    assert states == [State.DONE, State.DONE]
    assert after == code(MHA_POST)


UPSTREAM_0_5_13_APPLY = """
class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    def _build_cuda_graph_metadata(self, bs, num_tokens, forward_mode, spec_info, device):
        if forward_mode.is_draft_extend(include_v2=True):
            metadata.max_seq_len_q = num_tokens // bs

    def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, seq_lens_cpu):
        if forward_mode.is_draft_extend(include_v2=True):
            metadata = self.draft_extend_metadata[bs]
            if forward_mode.is_draft_extend_v2():
                num_tokens_per_bs = spec_info.num_tokens_per_req
                metadata.max_seq_len_q = num_tokens_per_bs
            else:
                extend_lens = spec_info.num_accept_tokens[:bs]
                metadata.cu_seqlens_q[1:].copy_(torch.cumsum(extend_lens, dim=0, dtype=torch.int32))
"""


UPSTREAM_0_5_17_APPLY = """
class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    def _build_cuda_graph_metadata(self, bs, num_tokens, forward_mode, spec_info, device):
        if forward_mode.is_target_verify():
            pass
        elif forward_mode.is_draft_extend_v2():
            metadata.max_seq_len_q = spec_info.num_tokens_per_req

    def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, seq_lens_cpu):
        if forward_mode.is_target_verify():
            pass
        elif forward_mode.is_draft_extend_v2():
            q_stride = metadata.max_seq_len_q
"""


@pytest.mark.parametrize("src", [UPSTREAM_0_5_13_APPLY, UPSTREAM_0_5_17_APPLY], ids=["0.5.13", "0.5.17"])
@pytest.mark.parametrize("codemod", [dev2.CaptureIncludesDraftExtendV2, dev2.ReplayDraftExtendV2Stride])
def test_mha_upstream_shapes_are_done(src, codemod):
    assert_state(codemod, src, State.DONE)


def test_mha_missing_anchors():
    no_branch = "class TRTLLMHAAttnBackend:\n    def init_forward_metadata_replay_cuda_graph(self, bs, spec_info):\n        pass\n"
    for codemod in (dev2.CaptureIncludesDraftExtendV2, dev2.ReplayDraftExtendV2Stride):
        assert_state(codemod, "class TRTLLMHAAttnBackend:\n    x = 1\n", State.MISSING)
    assert_state(dev2.ReplayDraftExtendV2Stride, no_branch, State.MISSING)
    # Something unrelated between the V1 statements: moving it under `else` would change V2, so refuse.
    interleaved = MHA_PRE.replace(
        "            else:\n                metadata.max_seq_len_q = 1\n",
        "            else:\n                metadata.max_seq_len_q = 1\n            self.vendor_hook(metadata)\n",
    )
    finding = detect(dev2.ReplayDraftExtendV2Stride, interleaved)
    assert finding.state is State.MISSING and "single run" in finding.detail
    renamed = MHA_PRE.replace("spec_info", "info")
    assert_state(dev2.ReplayDraftExtendV2Stride, renamed, State.MISSING)


def test_mha_helper_call_without_import_is_todo():
    src = MHA_POST.replace(
        "from sglang.srt._patchkit.backends.trtllm_mha import fill_draft_extend_v2_cu_seqlens_q\n", ""
    )
    before, after, again = run(dev2.ReplayDraftExtendV2Stride, src)
    assert (before, again) == (State.TODO, State.DONE)
    assert after == code(MHA_POST)


RUNNER_PRE = """
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)


class EAGLEDraftExtendCudaGraphRunner:
    def replay(self, forward_batch: ForwardBatch):
        out = self.output_buffers[bs]

        if self.forward_mode == ForwardMode.DRAFT_EXTEND_V2:
            # DRAFT_EXTEND_V2: all tokens calculations whether accepted or not.
            unpadding_bs = num_tokens
        elif bs != raw_bs:
            unpadding_bs = raw_bs
        else:
            unpadding_bs = None

        if unpadding_bs is not None:
            out_copy = out
            out = LogitsProcessorOutput(
                next_token_logits=out.next_token_logits[:unpadding_bs],
                hidden_states=out.hidden_states[:unpadding_bs],
            )
            out.topk_p = out_copy.topk_p[:unpadding_bs]
            out.topk_index = out_copy.topk_index[:unpadding_bs]
        return out
"""


def test_runner_topk_copies_skipped_for_v2():
    before, after, again = run(dev2.RunnerReplaySkipsTopkForV2, RUNNER_PRE)
    assert (before, again) == (State.TODO, State.DONE)
    assert after == code(RUNNER_PRE).replace(
        """            out.topk_p = out_copy.topk_p[:unpadding_bs]
            out.topk_index = out_copy.topk_index[:unpadding_bs]
""",
        """            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:
                out.topk_p = out_copy.topk_p[:unpadding_bs]
                out.topk_index = out_copy.topk_index[:unpadding_bs]
""",
    )
    assert_state(dev2.RunnerReplaySkipsTopkForV2, after, State.DONE)


def test_runner_topk_copies_in_a_fork_s_own_block():
    # A fork that copies top-k outside the unpadding branch, in a block of its own.
    src = RUNNER_PRE.replace(
        """            out.topk_p = out_copy.topk_p[:unpadding_bs]
            out.topk_index = out_copy.topk_index[:unpadding_bs]
        return out""",
        """            out.topk_p = None
        with vendor_profiler("topk"):
            out.topk_p = out.topk_p[:raw_bs]
            out.topk_index = out.topk_index[:raw_bs]
        return out""",
    ).replace("            out.topk_p = None\n", "")
    assert_codemod(
        dev2.RunnerReplaySkipsTopkForV2,
        src,
        src.replace(
            """            out.topk_p = out.topk_p[:raw_bs]
            out.topk_index = out.topk_index[:raw_bs]""",
            """            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:
                out.topk_p = out.topk_p[:raw_bs]
                out.topk_index = out.topk_index[:raw_bs]""",
        ),
    )


def test_runner_adds_forward_mode_import_when_a_fork_lacks_it():
    src = RUNNER_PRE.replace("    ForwardMode,\n", "").replace(
        "self.forward_mode == ForwardMode.DRAFT_EXTEND_V2", "self.forward_mode.is_draft_extend_v2()"
    )
    before, after, again = run(dev2.RunnerReplaySkipsTopkForV2, src)
    assert (before, again) == (State.TODO, State.DONE)
    assert "from sglang.srt.model_executor.forward_batch_info import ForwardMode" in after or "    ForwardMode" in after


@pytest.mark.parametrize(
    "src",
    [
        # 0.5.13: upstream's guard (and [:raw_bs] slices).
        RUNNER_PRE.replace(
            "            out.topk_p = out_copy.topk_p[:unpadding_bs]\n            out.topk_index = out_copy.topk_index[:unpadding_bs]\n",
            "            if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:\n"
            "                out.topk_p = out_copy.topk_p[:raw_bs]\n"
            "                out.topk_index = out_copy.topk_index[:raw_bs]\n",
        ),
        # A fork's positive form: top-k in the else of `if V2`.
        RUNNER_PRE.replace(
            "            out.topk_p = out_copy.topk_p[:unpadding_bs]\n            out.topk_index = out_copy.topk_index[:unpadding_bs]\n",
            "            if self.forward_mode.is_draft_extend_v2():\n"
            "                pass\n"
            "            else:\n"
            "                out.topk_p = out_copy.topk_p[:raw_bs]\n"
            "                out.topk_index = out_copy.topk_index[:raw_bs]\n",
        ),
        # 0.5.17: `execute`, the output never carries top-k.
        """
class EAGLEDraftExtendCudaGraphRunner(DecodeCudaGraphRunner):
    def execute(self, forward_batch):
        out = LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:num_tokens],
            hidden_states=out.hidden_states[:num_tokens],
        )
        return out
""",
    ],
    ids=["0.5.13", "else-of-v2", "0.5.17"],
)
def test_runner_upstream_shapes_are_done(src):
    assert_state(dev2.RunnerReplaySkipsTopkForV2, src, State.DONE)


def test_runner_missing_anchor():
    assert_state(dev2.RunnerReplaySkipsTopkForV2, "class EAGLEDraftExtendCudaGraphRunner:\n    pass\n", State.MISSING)
    scattered = RUNNER_PRE.replace(
        "            out.topk_index = out_copy.topk_index[:unpadding_bs]\n",
        "            log(out)\n            out.topk_index = out_copy.topk_index[:unpadding_bs]\n",
    )
    assert_state(dev2.RunnerReplaySkipsTopkForV2, scattered, State.MISSING)


KIT_PRE = """
import torch


def _assert_draft_extend_outputs_close(actual, expected, settings) -> None:
    torch.testing.assert_close(actual.topk_index, expected.topk_index)


@dataclass(frozen=True)
class EagleDraftExtendCudaGraphRunnerAdapter:
    assert_outputs_close: Callable = _assert_draft_extend_outputs_close


def run_dense_eagle_draft_extend_cuda_graph_runner_case(testcase, case):
    adapter = EagleDraftExtendCudaGraphRunnerAdapter(
        build_fixture=build_dense_attention_fixture,
    )


def run_dense_eagle_draft_extend_v2_cuda_graph_runner_case(testcase, case):
    adapter = EagleDraftExtendCudaGraphRunnerAdapter(
        build_fixture=build_dense_attention_fixture,
        make_forward_batch=_make_dense_eagle_draft_extend_v2_forward_batch,
    )


def run_mla_eagle_draft_extend_v2_cuda_graph_runner_case(testcase, case):
    adapter = EagleDraftExtendCudaGraphRunnerAdapter(build_fixture=build_mla_attention_fixture)
"""


def test_kit_adds_v2_assertion_and_hooks_the_v2_cases():
    before, after, again = run(dev2.TestKitV2OutputsClose, KIT_PRE)
    assert (before, again) == (State.TODO, State.DONE)
    module = cst.parse_module(after)
    v2 = primitives.find_function(module, dev2.V2_ASSERT)
    body = module.code_for_node(v2)
    assert (
        "next_token_logits" in body and "hidden_states" in body and "topk" not in body.split('"""')[-1].split("# ")[0]
    )
    assert after.index("def _assert_draft_extend_outputs_close") < after.index(
        "def _assert_draft_extend_v2_outputs_close"
    )
    assert after.count("assert_outputs_close=_assert_draft_extend_v2_outputs_close") == 2
    assert (
        "        make_forward_batch=_make_dense_eagle_draft_extend_v2_forward_batch,\n"
        "        assert_outputs_close=_assert_draft_extend_v2_outputs_close,\n    )" in after
    )
    assert (
        "EagleDraftExtendCudaGraphRunnerAdapter(build_fixture=build_mla_attention_fixture, assert_outputs_close="
        in after
    )
    # The V1 case keeps the default (top-k compared).
    v1 = module.code_for_node(primitives.find_function(module, "run_dense_eagle_draft_extend_cuda_graph_runner_case"))
    assert "assert_outputs_close" not in v1
    assert_state(dev2.TestKitV2OutputsClose, after, State.DONE)


def test_kit_upstream_shape_done_and_missing_anchor():
    done = (
        KIT_PRE.replace(
            "@dataclass",
            "def _assert_draft_extend_v2_outputs_close(actual, expected, settings) -> None:\n    pass\n\n\n@dataclass",
        )
        .replace(
            "make_forward_batch=_make_dense_eagle_draft_extend_v2_forward_batch,\n",
            "make_forward_batch=_make_dense_eagle_draft_extend_v2_forward_batch,\n        assert_outputs_close=_assert_draft_extend_v2_outputs_close,\n",
        )
        .replace(
            "(build_fixture=build_mla_attention_fixture)",
            "(build_fixture=build_mla_attention_fixture, assert_outputs_close=_assert_draft_extend_v2_outputs_close)",
        )
    )
    assert_state(dev2.TestKitV2OutputsClose, done, State.DONE)
    assert_state(dev2.TestKitV2OutputsClose, "def _assert_draft_extend_other():\n    pass\n", State.MISSING)
