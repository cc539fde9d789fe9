"""Snippet tests of tests/trees/test_trtllm_mla.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from patchkit.codemods import trtllm_mla_draft_skip_template as skip
from patchkit.codemods import trtllm_mla_spec_v2 as spec
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect, run_all

HEADER = """\
from __future__ import annotations

\"\"\"Docstring-like string, as in the real file.\"\"\"

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

"""


BACKEND = (
    HEADER
    + '''
class TRTLLMMLABackend(FlashInferMLAAttnBackend):
    """TRTLLM MLA attention kernel from flashinfer."""

    def __init__(self, model_runner, skip_prefill=False):
        super().__init__(model_runner, skip_prefill)
        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None):
        self.padded_q_buffer = torch.zeros((max_bs,))

        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1
'''
)


DRAFT = (
    HEADER
    + '''
class TRTLLMMLAMultiStepDraftBackend(FlashInferMLAMultiStepDraftBackend):
    """Multi-step draft backend for TRT-LLM MLA used by EAGLE."""

    def __init__(self, model_runner, topk, speculative_num_steps):
        super().__init__(model_runner, topk, speculative_num_steps)
'''
)


# sglang 0.5.17+: cuda_graph_custom_mask replaced by a verify_mask property.
LATER = (
    HEADER
    + """
class TRTLLMMLABackend(FlashInferMLAAttnBackend):
    needs_cpu_seq_lens: bool = False

    def __init__(self, model_runner, skip_prefill=False):
        self._verify_mask = None

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None):
        self._verify_mask = maybe_create_verify_mask(max_bs=max_bs)
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)

    @property
    def verify_mask(self):
        return self._verify_mask
"""
)


def test_backend_flag_added_after_docstring_with_upstream_comment():
    out = apply(spec.BackendOptsOutOfCpuSeqLens, BACKEND)
    assert out == BACKEND.replace(
        '''    """TRTLLM MLA attention kernel from flashinfer."""
''',
        '''    """TRTLLM MLA attention kernel from flashinfer."""

    # trtllm-gen kernels rebuild metadata from preallocated buffers and never
    # read seq_lens_cpu / seq_lens_sum; opt out of the D2H sync.
    needs_cpu_seq_lens: bool = False
''',
    )


def test_draft_flag_added_without_docstring():
    out = apply(
        spec.DraftBackendOptsOutOfCpuSeqLens,
        """
        class TRTLLMMLAMultiStepDraftBackend(FlashInferMLAMultiStepDraftBackend):
            def __init__(self):
                pass
        """,
    )
    assert out == code(
        """
        class TRTLLMMLAMultiStepDraftBackend(FlashInferMLAMultiStepDraftBackend):
            # Per-step draft decode never reads seq_lens_cpu / seq_lens_sum; opt out so
            # decide_needs_cpu_seq_lens' OR over the backends stays False.
            needs_cpu_seq_lens: bool = False
            def __init__(self):
                pass
        """
    )


@pytest.mark.parametrize("line", ["needs_cpu_seq_lens: bool = False", "needs_cpu_seq_lens = False"])
def test_flag_upstream_shapes_are_done(line):
    src = f"class TRTLLMMLAMultiStepDraftBackend(Base):\n    {line}\n"
    assert_state(spec.DraftBackendOptsOutOfCpuSeqLens, src, State.DONE)


def test_flag_set_otherwise_by_a_fork_is_not_overridden():
    finding = detect(spec.BackendOptsOutOfCpuSeqLens, "class TRTLLMMLABackend(B):\n    needs_cpu_seq_lens = True\n")
    assert finding.state is State.MISSING and "needs_cpu_seq_lens = True" in finding.detail
    finding = detect(spec.BackendOptsOutOfCpuSeqLens, "class TRTLLMMLABackend(B):\n    needs_cpu_seq_lens: bool\n")
    assert finding.state is State.MISSING and "without a value" in finding.detail


def test_init_sets_mask_to_none_last():
    out = apply(spec.InitCustomMask, BACKEND)
    assert out == BACKEND.replace(
        "        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens\n",
        "        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens\n"
        "        self.cuda_graph_custom_mask = None\n"
        "        # The draft worker's instances never verify: no tree mask there (sglang #31527).\n"
        '        self.is_draft_runner = getattr(model_runner, "is_draft_worker", False)\n',
    )


def test_alloc_goes_just_above_the_parent_call_and_imports_the_helper():
    expected = BACKEND.replace(
        """\
        self.padded_q_buffer = torch.zeros((max_bs,))

        super()""",
        """\
        self.padded_q_buffer = torch.zeros((max_bs,))

        # Target verify runs the trtllm-gen kernel, which takes no tree mask (sglang #32920).
        self.verify_tree_mask_is_read = False
        # Verify tree mask (bool) that build_tree_kernel_efficient fills in place, so
        # the GPU-only spec-v2 path needs no seq_lens_sum: FULL_MASK where verify
        # reads it, else the compact QLEN_ONLY layout (no context-wide fill a step).
        self.cuda_graph_custom_mask = alloc_cuda_graph_custom_mask(
            max_num_tokens=max_num_tokens,
            max_context_len=self.max_context_len,
            num_draft_tokens=self.num_draft_tokens,
            skip_prefill=self.skip_prefill,
            device=self.device,
            is_draft_runner=self.is_draft_runner,
            reads_mask=self.verify_tree_mask_is_read,
        )
        # The mask holds max_bs requests: the spec worker hands it to
        # build_tree_kernel_efficient only for a batch it fits, so an eager
        # batch above the captured size never writes past its end.
        self.verify_tree_mask_max_bs = max_bs

        super()""",
    ).replace(
        # In isort order among its sglang siblings (below the module string).
        "from sglang.srt.model_executor.forward_batch_info import",
        "from sglang.srt._patchkit.backends.trtllm_mla import alloc_cuda_graph_custom_mask\n"
        "from sglang.srt.model_executor.forward_batch_info import",
    )
    assert_codemod(spec.AllocCustomMask, BACKEND, expected)


def test_alloc_without_parent_call_goes_at_the_end():
    out = apply(
        spec.AllocCustomMask,
        """
        class TRTLLMMLABackend(B):
            def init_cuda_graph_state(self, max_bs, max_num_tokens):
                self.x = 1
        """,
    )
    assert out.index("self.x = 1") < out.index("self.cuda_graph_custom_mask = alloc_cuda_graph_custom_mask(")


def test_alloc_upstream_shape_is_done():
    src = """
        class TRTLLMMLABackend(B):
            def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None):
                if self.num_draft_tokens and not self.skip_prefill:
                    self.cuda_graph_custom_mask = torch.zeros(
                        max_num_tokens * (self.max_context_len + self.num_draft_tokens),
                        dtype=torch.bool,
                        device=self.device,
                    )
                super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
    """
    assert_state(spec.AllocCustomMask, src, State.DONE)


def test_alloc_needs_max_num_tokens():
    src = """
        class TRTLLMMLABackend(B):
            def init_cuda_graph_state(self, max_bs, num_tokens):
                pass
    """
    finding = detect(spec.AllocCustomMask, src)
    assert finding.state is State.MISSING and "max_num_tokens" in finding.detail


def test_verify_buffers_method_after_init_cuda_graph_state():
    expected = BACKEND.replace(
        """\
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
""",
        """\
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)

    def get_verify_buffers_to_fill_after_draft(self):
        \"\"\"[tree mask, positions] buffers that build_tree fills after draft.\"\"\"
        return verify_buffers_to_fill_after_draft(self.cuda_graph_custom_mask)
""",
    ).replace(
        "from sglang.srt.model_executor.forward_batch_info import",
        "from sglang.srt._patchkit.backends.trtllm_mla import verify_buffers_to_fill_after_draft\n"
        "from sglang.srt.model_executor.forward_batch_info import",
    )
    assert_codemod(spec.VerifyBuffersReturnCustomMask, BACKEND, expected)


def test_verify_buffers_upstream_shape_done_and_foreign_override_refused():
    upstream = """
        class TRTLLMMLABackend(B):
            def get_verify_buffers_to_fill_after_draft(self):
                return [self.cuda_graph_custom_mask, None]
    """
    assert_state(spec.VerifyBuffersReturnCustomMask, upstream, State.DONE)
    foreign = upstream.replace("self.cuda_graph_custom_mask", "self.my_mask")
    assert_state(spec.VerifyBuffersReturnCustomMask, foreign, State.MISSING)


@pytest.mark.parametrize(
    "codemod, state",
    [
        (spec.BackendOptsOutOfCpuSeqLens, State.DONE),
        (spec.InitCustomMask, State.SUPERSEDED),
        (spec.AllocCustomMask, State.SUPERSEDED),
        (spec.VerifyBuffersReturnCustomMask, State.SUPERSEDED),
    ],
)
def test_later_upstream_verify_mask_supersedes_the_custom_mask(codemod, state):
    finding = detect(codemod, LATER)
    assert finding.state is state
    if state is State.SUPERSEDED:
        assert "verify_mask" in finding.detail


def test_all_spec_codemods_together_then_idempotent():
    codemods = [
        spec.BackendOptsOutOfCpuSeqLens,
        spec.DraftBackendOptsOutOfCpuSeqLens,
        spec.InitCustomMask,
        spec.AllocCustomMask,
        spec.VerifyBuffersReturnCustomMask,
    ]
    out, states = run_all(codemods, BACKEND + DRAFT.replace(HEADER, ""))
    assert states == [State.DONE] * len(codemods)
    compile(out, "patched", "exec")


def test_draft_overrides_added_after_init():
    out = apply(skip.DraftInitMetadataSkipsTemplate, DRAFT)
    out = apply(skip.DraftReplaySkipsTemplate, out)
    assert (
        out
        == DRAFT
        + """
    def init_forward_metadata(self, forward_batch: ForwardBatch):
        # Skip common_template: each TRT-LLM MLA step backend builds its own
        # block kv-indices from req_pool_indices / seq_lens, so the parent's
        # generate_draft_decode_kv_indices kernel and kv_indptr slicing are
        # unused.
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)

    def init_forward_metadata_replay_cuda_graph(
        self, forward_batch: ForwardBatch, bs: int
    ):
        # Skip common_template (see init_forward_metadata). seq_lens_sum=None: the
        # step backends need no host-side mirror of the sequence lengths.
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata_replay_cuda_graph(
                bs,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                seq_lens_sum=None,
                encoder_lens=None,
                forward_mode=ForwardMode.DECODE,
                spec_info=forward_batch.spec_info,
                seq_lens_cpu=forward_batch.seq_lens_cpu,
            )
"""
    )


def test_draft_overrides_import_forward_mode_when_missing():
    src = """
        class TRTLLMMLAMultiStepDraftBackend(B):
            def __init__(self):
                pass
    """
    out = apply(skip.DraftReplaySkipsTemplate, src)
    assert out.startswith(
        "from sglang.srt.model_executor.forward_batch_info import ForwardBatch\n"
        "from sglang.srt.model_executor.forward_batch_info import ForwardMode\n"
    )


def test_draft_upstream_shapes_are_done():
    # 0.5.13+: init_forward_metadata loops; the replay hook is renamed and only
    # its capture branch goes to the parent.
    src = """
        class TRTLLMMLAMultiStepDraftBackend(B):
            def init_forward_metadata(self, forward_batch):
                for i in range(self.speculative_num_steps - 1):
                    self.attn_backends[i].init_forward_metadata(forward_batch)

            def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
                if in_capture:
                    return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
                for i in range(self.speculative_num_steps - 1):
                    self.attn_backends[i].init_forward_metadata_out_graph(forward_batch)
    """
    assert_state(skip.DraftInitMetadataSkipsTemplate, src, State.DONE)
    finding = detect(skip.DraftReplaySkipsTemplate, src)
    assert finding.state is State.DONE and finding.anchor.endswith("init_forward_metadata_out_graph")


def test_draft_override_through_common_template_is_refused():
    src = """
        class TRTLLMMLAMultiStepDraftBackend(B):
            def init_forward_metadata(self, forward_batch):
                def call_fn(i, forward_batch):
                    self.attn_backends[i].init_forward_metadata(forward_batch)
                self.common_template(forward_batch, self.kv, call_fn)

            def init_forward_metadata_replay_cuda_graph(self, forward_batch, bs):
                super().init_forward_metadata_replay_cuda_graph(forward_batch, bs)
    """
    assert_state(skip.DraftInitMetadataSkipsTemplate, src, State.MISSING)
    assert_state(skip.DraftReplaySkipsTemplate, src, State.MISSING)


def test_missing_classes_are_reported_missing():
    for codemod in (
        spec.BackendOptsOutOfCpuSeqLens,
        spec.DraftBackendOptsOutOfCpuSeqLens,
        skip.DraftInitMetadataSkipsTemplate,
    ):
        assert_state(codemod, "x = 1\n", State.MISSING)


def test_patched_draft_overrides_call_each_step_once_without_common_template():
    """Run the patched snippet: mocks for the step backends, a parent whose
    common_template fails the test if reached."""
    src = apply(skip.DraftReplaySkipsTemplate, apply(skip.DraftInitMetadataSkipsTemplate, DRAFT))
    src = src.replace("import torch\n", "").replace(
        "from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode\n", ""
    )

    class Parent:
        def __init__(self, model_runner, topk, speculative_num_steps):
            self.speculative_num_steps = speculative_num_steps
            self.attn_backends = [mock.Mock(name=f"step{i}") for i in range(speculative_num_steps - 1)]

        def common_template(self, *args):
            raise AssertionError("common_template must not run")

    namespace = {
        "FlashInferMLAMultiStepDraftBackend": Parent,
        "ForwardBatch": object,
        "ForwardMode": SimpleNamespace(DECODE="DECODE"),
    }
    exec(compile(src, "patched", "exec"), namespace)
    backend = namespace["TRTLLMMLAMultiStepDraftBackend"](None, 1, 4)
    batch = SimpleNamespace(req_pool_indices="rpi", seq_lens="sl", spec_info="si", seq_lens_cpu="slc")

    backend.init_forward_metadata(batch)
    backend.init_forward_metadata_replay_cuda_graph(batch, 7)
    assert len(backend.attn_backends) == 3
    for step in backend.attn_backends:
        step.init_forward_metadata.assert_called_once_with(batch)
        step.init_forward_metadata_replay_cuda_graph.assert_called_once_with(
            7,
            "rpi",
            "sl",
            seq_lens_sum=None,
            encoder_lens=None,
            forward_mode="DECODE",
            spec_info="si",
            seq_lens_cpu="slc",
        )
