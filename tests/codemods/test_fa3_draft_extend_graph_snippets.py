"""Snippet tests of tests/trees/test_fa3_draft_extend_graph.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.codemods import fa3_draft_extend_graph as deg
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, detect, run

WORKER = "srt/speculative/eagle_worker_v2.py"


FA3 = "srt/layers/attention/flashattention_backend.py"


LET_IN = """\
        if (
            _is_cuda
            and not supports_cuda_draft_extend_graph
            and (self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)
        ):
            # patchkit fa3-draft-extend-graph (upstream 0.5.23): FA3 has CUDA-graph
            # metadata for DRAFT_EXTEND_V2 (capture and replay), so its draft extend is
            # captured too. CUDA only, imported here: MUSA and NPU builds must not
            # import sgl_kernel. Eager with an FR-Spec token map: the graph's logits
            # buffer is not sized for its reduced head (EAGLE3's draft vocab is).
            from sglang.srt.layers.attention.flashattention_backend import (
                FlashAttentionBackend,
            )

            supports_cuda_draft_extend_graph = isinstance(
                self.draft_extend_attn_backend, FlashAttentionBackend
            )
"""


HEAD = """\
_is_cuda = is_cuda()


class EagleDraftWorker(BaseDraftWorker):
    def __init__(self, server_args):
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)

    def init_token_map(self):
        self.hot_token_id = None

    def init_cuda_graphs(self):
"""


TAIL = """\
        # Capture extend
        if self.draft_extend_attn_backend and supports_cuda_draft_extend_graph:
            pass
"""


def worker(check: str, let_in: str = "") -> str:
    """A worker whose graph check is ``check`` (statements at method level)."""
    return HEAD + check + let_in + TAIL


OR_CHAIN = """\
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
        )
"""


TUPLE = """\
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and isinstance(
            self.draft_extend_attn_backend, (TritonAttnBackend, TRTLLMMLABackend, VendorAttnBackend)
        )
"""


LIST = """\
        graph_supported_backend_types = [TritonAttnBackend, FlashInferAttnBackend]
        if _is_cuda or _is_musa:
            graph_supported_backend_types.append(VendorAttnBackend)
        graph_supported_backend = isinstance(
            self.draft_extend_attn_backend, tuple(graph_supported_backend_types)
        )
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and graph_supported_backend
"""


@pytest.mark.parametrize("form", [OR_CHAIN, TUPLE, LIST], ids=["or-chain", "isinstance-tuple", "appended-list"])
def test_fa3_is_let_in_after_the_check_whatever_its_form(form):
    """The vendor's expression stays byte for byte; FA3 is admitted after it."""
    assert_codemod(deg.GraphCheckAdmitsFA3, worker(form), worker(form, LET_IN))


UPSTREAM_FORM = """\
        graph_supported_backend_types = [TritonAttnBackend]
        if _is_cuda:
            from sglang.srt.layers.attention.flashattention_backend import (
                FlashAttentionBackend,
            )

            graph_supported_backend_types.append(FlashAttentionBackend)
        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and isinstance(
            self.draft_extend_attn_backend, tuple(graph_supported_backend_types)
        )
"""


VENDOR_TUPLE = """\
        supports_cuda_draft_extend_graph = _is_cuda and isinstance(
            self.draft_extend_attn_backend, (TritonAttnBackend, FlashAttentionBackend)
        )
"""


VENDOR_CHAIN = """\
        supports_cuda_draft_extend_graph = _is_cuda and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, FlashAttentionBackend)
        )
"""


@pytest.mark.parametrize(
    "form", [UPSTREAM_FORM, VENDOR_TUPLE, VENDOR_CHAIN], ids=["upstream-append", "vendor-tuple", "vendor-chain"]
)
def test_a_check_that_already_lists_fa3_is_done_and_untouched(form):
    assert_state(deg.GraphCheckAdmitsFA3, worker(form), State.DONE)


def test_the_check_in_a_nested_block_is_still_found():
    nested = "        if True:\n" + OR_CHAIN.replace("\n        ", "\n            ").replace(
        "        supports", "            supports", 1
    )
    before, out, after = run(deg.GraphCheckAdmitsFA3, worker(nested))
    assert (before, after) == (State.TODO, State.DONE)
    assert "            if (\n                _is_cuda\n                and not supports_cuda_draft_extend_graph" in out


@pytest.mark.parametrize(
    "src, says",
    [
        (worker(OR_CHAIN).replace("_is_cuda = is_cuda()", "_on_gpu = is_cuda()"), "defines no `_is_cuda`"),
        (worker(OR_CHAIN).replace("self.hot_token_id = None", "self.token_map = None"), "never sets self.hot_token_id"),
        (worker("        pass\n"), "no method of EagleDraftWorker assigns supports_cuda_draft_extend_graph"),
        (
            worker(OR_CHAIN).replace("self.speculative_algorithm =", "self.algorithm ="),
            "never sets self.speculative_algorithm",
        ),
    ],
    ids=["no-cuda-flag", "no-hot-token-id", "no-graph-check", "no-algorithm"],
)
def test_missing_anchors_name_file_line_and_what_is_needed(src, says):
    finding = detect(deg.GraphCheckAdmitsFA3, src, filename=WORKER)
    assert finding.state is State.MISSING and says in finding.detail and f"{WORKER}:" in finding.detail


FA3_BRANCHES = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata_capture_cuda_graph(self, bs, forward_mode):
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend(include_v2=True):
            metadata = FlashAttentionMetadata()
            self.draft_extend_metadata[bs] = metadata

    def init_forward_metadata_replay_cuda_graph(self, bs, forward_mode):
        if forward_mode.is_decode_or_idle():
            pass
        elif forward_mode.is_draft_extend_v2():
            metadata = self.draft_extend_metadata[bs]
"""


def test_fa3_with_both_graph_branches_needs_nothing():
    assert_state(deg.FA3HasDraftExtendGraphBranches, FA3_BRANCHES, State.SUPERSEDED)


@pytest.mark.parametrize(
    "drop, kind",
    [
        ("elif forward_mode.is_draft_extend_v2():", "replay"),
        ("elif forward_mode.is_draft_extend(include_v2=True):", "capture"),
    ],
)
def test_fa3_without_a_graph_branch_is_refused_naming_it(drop, kind):
    src = FA3_BRANCHES.replace(drop, "elif forward_mode.is_draft_extend():")
    finding = detect(deg.FA3HasDraftExtendGraphBranches, src, filename=FA3)
    assert finding.state is State.MISSING
    assert f"no DRAFT_EXTEND_V2 CUDA-graph {kind} branch" in finding.detail and f"{FA3}:" in finding.detail


#: What patchkit wrote before EAGLE3 drafts with a d2t map were let in (issue 40).
EARLIER_LET_IN = """\
        if _is_cuda and not supports_cuda_draft_extend_graph and self.hot_token_id is None:
            # patchkit fa3-draft-extend-graph (upstream 0.5.23): FA3 has CUDA-graph
            # metadata for DRAFT_EXTEND_V2 (capture and replay), so its draft extend is
            # captured too. CUDA only, imported here: MUSA and NPU builds must not
            # import sgl_kernel. Eager with a speculative token map: the graph's
            # logits buffer is sized to the full vocab, not the reduced draft head.
            from sglang.srt.layers.attention.flashattention_backend import (
                FlashAttentionBackend,
            )

            supports_cuda_draft_extend_graph = isinstance(
                self.draft_extend_attn_backend, FlashAttentionBackend
            )
"""


def test_an_earlier_patchkits_check_is_brought_to_this_form():
    """A tree patched before kept every EAGLE3 checkpoint with a reduced draft
    vocab eager; apply rewrites its test and comment, to what a fresh apply writes."""
    assert_state(deg.GraphCheckAdmitsFA3, worker(OR_CHAIN, EARLIER_LET_IN), State.TODO)
    assert_codemod(deg.GraphCheckAdmitsFA3, worker(OR_CHAIN, EARLIER_LET_IN), worker(OR_CHAIN, LET_IN))
