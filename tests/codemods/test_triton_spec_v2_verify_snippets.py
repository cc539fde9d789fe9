"""Snippet tests of tests/trees/test_triton_spec_v2_verify.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from patchkit.backends import verify_tree_mask as vtm
from patchkit.codemods.common.base import State
from patchkit.codemods.triton_spec_v2_verify import TritonRecordsTreeMaskMaxBs as CODEMOD
from patchkit.codemods.triton_spec_v2_verify import TritonVerifyKvIndicesFromHost as KV  # noqa: E402
from patchkit.testing import assert_codemod, assert_state, code, detect

BEFORE = code("""
    class TritonAttnBackend(AttentionBackend):
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None):
            self.cuda_graph_kv_indices = kv_indices_buf
            if not self.skip_prefill:
                self.cuda_graph_custom_mask = torch.zeros(
                    (max_num_tokens * self.max_context_len),
                    dtype=torch.uint8,
                    device=self.device,
                )

            if self.sliding_window_size is not None:
                pass
""")


AFTER = BEFORE.replace(
    "(max_num_tokens * self.max_context_len),",
    "(max_num_tokens * (self.max_context_len + (self.num_draft_tokens or 0))),",
).replace(
    "            )\n\n",
    "            )\n"
    "            # C + D cells a verify token (a row is seq_len + D), and the batch size it\n"
    "            # holds: the spec-v2 workers hand it only to a batch it fits (sglang 0.5.17).\n"
    "            self.verify_tree_mask_max_bs = max_bs\n\n",
    1,
)


LATER = code("""
    class TritonAttnBackend(AttentionBackend):
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
            self._verify_mask = maybe_create_verify_mask(max_bs=max_bs)

        @property
        def verify_mask(self):
            return self._verify_mask
""")


def test_the_mask_grows_by_the_draft_tokens_and_records_max_bs():
    assert_codemod(CODEMOD, BEFORE, AFTER)


def test_upstreams_verify_mask_is_done_and_an_unknown_size_is_missing():
    assert_state(CODEMOD, LATER, State.DONE, "0.5.17")
    other = BEFORE.replace("(max_num_tokens * self.max_context_len)", "(acme_mask_cells)")
    finding = detect(CODEMOD, other)
    assert finding.state is State.MISSING and "acme_mask_cells" in finding.detail


@pytest.mark.parametrize("bs, fits", [(4, True), (3, True), (5, False)])
def test_the_workers_guard_now_bounds_the_patched_triton_mask(bs, fits):
    """With the patched size and record, verify_tree_mask_for_batch keeps the
    mask up to the captured max_bs (rows of C + D cells: the worst case of
    any batch it holds) and hands None above it; pristine (no record) got
    it for every batch."""
    torch = pytest.importorskip("torch")
    max_bs, d, c = 4, 3, 64
    mask = torch.zeros(max_bs * d * (c + d), dtype=torch.uint8)
    backend = SimpleNamespace(verify_tree_mask_max_bs=max_bs, max_context_len=c)
    seq_lens = torch.full((bs,), c)
    assert (vtm.verify_tree_mask_for_batch(mask, backend, seq_lens, d) is mask) is fits
    pristine = SimpleNamespace(max_context_len=c)
    assert (
        vtm.verify_tree_mask_for_batch(torch.zeros(max_bs * d * c, dtype=torch.uint8), pristine, seq_lens, d)
        is not None
    )


VERIFY = code("""
    class TritonAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch):
            if forward_batch.forward_mode.is_decode_or_idle():
                kv_indices = torch.empty(forward_batch.seq_lens_sum, dtype=torch.int64, device=self.device)
            elif forward_batch.forward_mode.is_target_verify():
                bs = len(forward_batch.req_pool_indices)
                kv_indptr[1 : bs + 1] = torch.cumsum(forward_batch.seq_lens, dim=0)
                kv_indptr = kv_indptr[: bs + 1]
                kv_indices = torch.empty(
                    kv_indptr[-1], dtype=torch.int64, device=self.device
                )
""")


def test_the_verify_kv_indices_are_sized_from_the_host():
    after = VERIFY.replace(
        "kv_indptr[-1], dtype",
        "seq_lens_sum_or_bound(forward_batch.seq_lens_sum, bs, self.max_context_len, forward_batch), dtype",
    )
    assert_codemod(KV, VERIFY, "from sglang.srt._patchkit.runtime import seq_lens_sum_or_bound\n" + after)


def test_upstreams_host_size_and_no_branch_are_superseded():
    """0.5.13+ size it from seq_lens_sum themselves: nothing to add (and a
    pristine 0.5.13 is not shown half-patched for it)."""
    upstream = VERIFY.replace("kv_indptr[-1], dtype", "seq_lens_sum, dtype")
    assert_state(KV, upstream, State.SUPERSEDED)
    moved = code("""
        class TritonAttnBackend(AttentionBackend):
            def init_forward_metadata(self, forward_batch):
                self._plan(forward_batch)
    """)
    assert_state(KV, moved, State.SUPERSEDED)


def test_without_a_bs_the_batch_size_is_read_from_the_batch():
    src = VERIFY.replace("            bs = len(forward_batch.req_pool_indices)\n", "")
    from patchkit.testing import apply

    assert (
        "seq_lens_sum_or_bound(forward_batch.seq_lens_sum, forward_batch.batch_size, self.max_context_len, forward_batch)"
        in apply(KV, src)
    )
