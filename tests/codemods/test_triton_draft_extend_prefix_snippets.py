"""triton-draft-extend-prefix (sglang #26651) on snippets: the captured V2 draft
extend's replay builds its prefix from seq_lens less the extend lengths
(0.5.8 .. 0.5.12.post1 shape), upstream's 0.5.13+ helper is done, a branch for
V1 alone (0.5.4 .. 0.5.7) moots the patch, a fork's own prefix is left to it,
and the numbers are the kernel's prefix."""

from __future__ import annotations

import pytest

from patchkit.codemods import triton_draft_extend_prefix as tdep
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect, run

CODEMOD = tdep.TritonDraftExtendReplayReadsThePrefix

BEFORE = code("""
    class TritonAttnBackend:
        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_decode_or_idle():
                kv_indptr = self.kv_indptr
            elif forward_mode.is_draft_extend(include_v2=True):
                seq_lens = seq_lens[:bs]
                num_tokens_per_bs = self.speculative_num_steps + 1
                kv_indptr = self.kv_indptr[: bs + 1]
                kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)
                kv_indices = self.cuda_graph_kv_indices
                create_flashinfer_kv_indices_triton[(bs,)](
                    self.req_to_token,
                    req_pool_indices,
                    seq_lens,
                    kv_indptr,
                    None,
                    kv_indices,
                    self.req_to_token.stride(0),
                )
            else:
                raise ValueError(f"Invalid forward mode: {forward_mode=} for CUDA Graph replay.")
""")
AFTER = code("""
    class TritonAttnBackend:
        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_decode_or_idle():
                kv_indptr = self.kv_indptr
            elif forward_mode.is_draft_extend(include_v2=True):
                seq_lens = seq_lens[:bs]
                num_tokens_per_bs = self.speculative_num_steps + 1
                kv_indptr = self.kv_indptr[: bs + 1]
                # patchkit triton-draft-extend-prefix (sglang #26651): spec v2 adds the
                # draft tokens to seq_lens before the draft extend, and the extend kernel
                # takes them as its extend part: the prefix is the rest (0 on padded rows).
                draft_extend_prefix_lens = seq_lens
                if forward_mode.is_draft_extend_v2() and getattr(spec_info, "extend_seq_lens_tensor", None) is not None:
                    draft_extend_prefix_lens = torch.clamp(
                        seq_lens - spec_info.extend_seq_lens_tensor[:bs], min=0
                    ).to(seq_lens.dtype)
                kv_indptr[1 : bs + 1] = torch.cumsum(draft_extend_prefix_lens, dim=0)
                kv_indices = self.cuda_graph_kv_indices
                create_flashinfer_kv_indices_triton[(bs,)](
                    self.req_to_token,
                    req_pool_indices,
                    draft_extend_prefix_lens,
                    kv_indptr,
                    None,
                    kv_indices,
                    self.req_to_token.stride(0),
                )
            else:
                raise ValueError(f"Invalid forward mode: {forward_mode=} for CUDA Graph replay.")
""")


def test_the_replay_reads_the_prefix_and_a_second_apply_changes_nothing():
    assert_codemod(CODEMOD, BEFORE, AFTER)
    assert_state(CODEMOD, AFTER, State.DONE)


def test_a_longer_chain_and_an_early_return_in_the_other_branches():
    """A fork's chain with more branches, one returning early: only the draft-extend branch changes."""
    src = BEFORE.replace(
        "        else:\n            raise",
        "        elif forward_mode.is_target_verify():\n            return None\n"
        "        elif forward_mode.is_dllm_extend():\n            kv_indptr = None\n        else:\n            raise",
    )
    out = AFTER.replace(
        "        else:\n            raise",
        "        elif forward_mode.is_target_verify():\n            return None\n"
        "        elif forward_mode.is_dllm_extend():\n            kv_indptr = None\n        else:\n            raise",
    )
    assert src != BEFORE
    assert_codemod(CODEMOD, src, out)


UPSTREAM = code("""
    class TritonAttnBackend:
        def _update_draft_extend_buffers(self, bs, seq_lens, req_pool_indices, forward_mode, spec_info):
            if forward_mode.is_draft_extend_v2():
                if spec_info is not None and getattr(spec_info, "extend_seq_lens_tensor", None) is not None:
                    extend_seq_lens = spec_info.extend_seq_lens_tensor[:bs].to(torch.int32)
                kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0)
""")
V1_ONLY = code("""
    class TritonAttnBackend:
        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_draft_extend():
                kv_indptr = self.kv_indptr[: bs + 1]
                kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)
""")


def test_upstream_is_done_and_a_v1_branch_is_moot():
    finding = assert_state(CODEMOD, UPSTREAM, State.DONE)
    assert "_update_draft_extend_buffers" in finding.detail
    finding = detect(CODEMOD, V1_ONLY)
    assert finding.state is State.SUPERSEDED and finding.moots_patch and "V1 only" in finding.detail


def test_a_fork_that_builds_its_own_prefix_is_left_to_it():
    """A branch that already narrows the prefix its own way (values through a local)."""
    src = BEFORE.replace(
        "            kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)\n",
        "            prefix = seq_lens - num_tokens_per_bs\n"
        "            kv_indptr[1 : bs + 1] = torch.cumsum(prefix, dim=0)\n",
    )
    assert src != BEFORE
    finding = detect(CODEMOD, src)
    assert (
        finding.state is State.SUPERSEDED and finding.by_tree and "builds the draft extend's prefix" in finding.detail
    )
    assert run(CODEMOD, src)[1] == src  # nothing written


def test_a_tree_without_the_branch_is_refused_in_one_line():
    src = BEFORE.replace("forward_mode.is_draft_extend(include_v2=True)", "forward_mode.is_draft_extend_v2()")
    finding = detect(CODEMOD, src.replace("is_decode_or_idle", "is_decode"))
    assert finding.state is State.MISSING and "is_draft_extend(include_v2=True)" in finding.detail


def test_the_prefix_is_what_the_kernel_must_read():
    """What the edit computes: spec v2's seq_lens hold prefix + extend; the padded rows (the
    fill value 1, extend lengths num_tokens_per_bs) clamp to an empty prefix."""
    torch = pytest.importorskip("torch")
    prefix = torch.tensor([5, 17, 0], dtype=torch.int32)
    extend = torch.tensor([4, 4, 4], dtype=torch.int32)
    seq_lens = torch.cat([prefix[:2] + extend[:2], torch.tensor([1], dtype=torch.int32)])
    got = torch.clamp(seq_lens - extend[:3], min=0).to(seq_lens.dtype)
    assert got.tolist() == [5, 17, 0] and got.dtype == seq_lens.dtype
    assert torch.cumsum(got, dim=0).tolist() == [5, 22, 22]
