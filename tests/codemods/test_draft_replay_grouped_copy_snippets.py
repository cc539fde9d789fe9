"""Snippet tests of tests/trees/test_draft_replay_grouped_copy.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.codemods import draft_replay_grouped_copy as gc
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect

EXTEND = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


BEFORE = code("""
    import torch


    class EAGLEDraftExtendCudaGraphRunner:
        def replay(self, forward_batch):
            buffers = self.buffers
            if bs != raw_bs:
                buffers.seq_lens.fill_(1)

            # Common inputs
            buffers.input_ids[:num_tokens].copy_(forward_batch.input_ids)
            buffers.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
            if forward_batch.extend_seq_lens is not None:
                buffers.extend_seq_lens[:raw_bs].copy_(forward_batch.extend_seq_lens)
            else:
                buffers.extend_seq_lens[:raw_bs].fill_(1)
            maybe_detect_nan(forward_batch.positions, "positions")
            buffers.hidden_states[:num_tokens].copy_(forward_batch.spec_info.hidden_states)
            buffers.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)

            if forward_batch.seq_lens_cpu is not None:
                buffers.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
            self.attn_backend.init(buffers.seq_lens[:bs])
""")


AFTER = code("""
    import torch
    from sglang.srt._patchkit.runtime import copy_grouped


    class EAGLEDraftExtendCudaGraphRunner:
        def replay(self, forward_batch):
            buffers = self.buffers
            if bs != raw_bs:
                buffers.seq_lens.fill_(1)

            # Common inputs
            # patchkit (sglang #28465): the fields go into the graph's buffers together, one
            # torch._foreach_copy_ per dtype pair (hidden_states keeps its copy_), not a memcpy each.
            field_copies = []
            field_copies.append((buffers.input_ids[:num_tokens], forward_batch.input_ids))
            field_copies.append((buffers.seq_lens[:raw_bs], forward_batch.seq_lens))
            if forward_batch.extend_seq_lens is not None:
                field_copies.append((buffers.extend_seq_lens[:raw_bs], forward_batch.extend_seq_lens))
            else:
                buffers.extend_seq_lens[:raw_bs].fill_(1)
            maybe_detect_nan(forward_batch.positions, "positions")
            buffers.hidden_states[:num_tokens].copy_(forward_batch.spec_info.hidden_states)
            field_copies.append((buffers.req_pool_indices[:raw_bs], forward_batch.req_pool_indices))
            copy_grouped(field_copies)

            if forward_batch.seq_lens_cpu is not None:
                buffers.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
            self.attn_backend.init(buffers.seq_lens[:bs])
""")


def test_the_per_field_copies_are_queued_and_run_grouped_after_the_last():
    assert_codemod(gc.GroupDraftExtendCopies, BEFORE, AFTER)


def test_a_fork_that_names_its_buffers_and_batch_otherwise():
    """Buffers on ``self`` (0.5.4 .. 0.5.9), a batch named ``fb``, a list name the method uses already."""
    rename = {"buffers.": "self.", "forward_batch": "fb", "# Common inputs": "field_copies = None"}
    unpacked = "        buffers = self.buffers\n"
    src, out = BEFORE.replace(unpacked, ""), AFTER.replace(unpacked, "").replace("field_copies", "field_copies_")
    for old, new in rename.items():
        src, out = src.replace(old, new), out.replace(old, new)
    out = out.replace("field_copies_ = None", "field_copies = None")
    assert_codemod(gc.GroupDraftExtendCopies, src, out)


def test_the_draft_runner_and_upstreams_execute():
    draft = BEFORE.replace("EAGLEDraftExtendCudaGraphRunner", "EAGLEDraftCudaGraphRunner")
    assert_codemod(
        gc.GroupDraftCopies, draft, AFTER.replace("EAGLEDraftExtendCudaGraphRunner", "EAGLEDraftCudaGraphRunner")
    )
    upstream = code("""
        class EAGLEDraftCudaGraphRunner:
            def execute(self, forward_batch):
                copy_dsts = [buffers.seq_lens[:raw_bs], buffers.positions[:raw_num_token]]
                copy_srcs = [forward_batch.seq_lens, forward_batch.positions]
                _grouped_foreach_copy_(copy_dsts, copy_srcs)
                buffers.hidden_states[:raw_bs].copy_(forward_batch.spec_info.hidden_states)
    """)
    assert_state(gc.GroupDraftCopies, upstream, State.DONE)


@pytest.mark.parametrize(
    "own",
    [
        "torch._foreach_copy_([buffers.input_ids[:num_tokens]], [forward_batch.input_ids])",
        "our_foreach_copy(buffers, forward_batch)",
    ],
)
def test_a_forks_own_grouped_copy_is_superseded_naming_its_line(own):
    src = BEFORE.replace("buffers.input_ids[:num_tokens].copy_(forward_batch.input_ids)", own)
    finding = assert_state(gc.GroupDraftExtendCopies, src, State.SUPERSEDED, "groups its buffer copies")
    assert finding.by_tree and own[:40] in finding.detail


def test_one_copy_is_a_missing_anchor_that_says_what_it_needs():
    lone = code("""
        class EAGLEDraftExtendCudaGraphRunner:
            def replay(self, forward_batch):
                buffers.hidden_states[:n].copy_(forward_batch.spec_info.hidden_states)
                buffers.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
    """)
    finding = detect(gc.GroupDraftExtendCopies, lone, EXTEND)
    assert finding.state is State.MISSING
    assert f"{EXTEND}:2" in finding.detail and "fewer than two per-field" in finding.detail


@pytest.mark.parametrize(
    "between, why",
    [
        ("self.attn_backend.peek(buffers.seq_lens)", "reads buffers.seq_lens, copied before it"),
        ("forward_batch.input_ids.clamp_(0)", "changes forward_batch.input_ids in place"),
    ],
)
def test_a_statement_the_grouping_would_reorder_is_a_missing_anchor_naming_it(between, why):
    src = BEFORE.replace('maybe_detect_nan(forward_batch.positions, "positions")', between)
    finding = detect(gc.GroupDraftExtendCopies, src, EXTEND)
    assert finding.state is State.MISSING
    assert f"{EXTEND}:17" in finding.detail and why in finding.detail
