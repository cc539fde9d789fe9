"""flashinfer-swa-host-sum (sglang #32218) on snippets: the paged window
branch's device sum becomes the CPU mirror's clamped sum for a target verify
(0.5.14 .. 0.5.19 shape), upstream's 0.5.20 shape is done, a method without
the prefix_lens=None fill (0.5.10 .. 0.5.13) moots the patch, and the
numbers are the same."""

from __future__ import annotations

import pytest

from patchkit.codemods import flashinfer_swa_host_sum as swa
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect

BEFORE = code("""
    class FlashInferIndicesUpdaterPrefill:
        def update_sliding_window(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens, spec_info, use_ragged):
            if prefix_lens is None:
                num_accept_tokens = getattr(spec_info, "num_accept_tokens", None)
                prefix_lens = seq_lens if num_accept_tokens is None else seq_lens - num_accept_tokens
            sliding_window_size = self.sliding_window_size
            for wrapper_id in range(2):
                if wrapper_id == 0:
                    if use_ragged:
                        paged_kernel_lens = prefix_lens - effective_start
                        paged_kernel_lens_sum = paged_kernel_lens.sum().item()
                    else:
                        paged_kernel_lens = torch.minimum(
                            seq_lens,
                            sliding_window_size + seq_lens - prefix_lens,
                        )
                        paged_kernel_lens_sum = paged_kernel_lens.sum().item()
                        kv_start_idx = seq_lens - paged_kernel_lens
                else:
                    paged_kernel_lens_sum = seq_lens_sum
""")
AFTER = code("""
    class FlashInferIndicesUpdaterPrefill:
        def update_sliding_window(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens, spec_info, use_ragged):
            # patchkit flashinfer-swa-host-sum (sglang #32218): no prefix given and no accepted-token
            # counts (the target verify): the prefix filled below is the whole sequence.
            prefix_is_full_seq = prefix_lens is None and getattr(spec_info, "num_accept_tokens", None) is None

            if prefix_lens is None:
                num_accept_tokens = getattr(spec_info, "num_accept_tokens", None)
                prefix_lens = seq_lens if num_accept_tokens is None else seq_lens - num_accept_tokens
            sliding_window_size = self.sliding_window_size
            for wrapper_id in range(2):
                if wrapper_id == 0:
                    if use_ragged:
                        paged_kernel_lens = prefix_lens - effective_start
                        paged_kernel_lens_sum = paged_kernel_lens.sum().item()
                    else:
                        paged_kernel_lens = torch.minimum(
                            seq_lens,
                            sliding_window_size + seq_lens - prefix_lens,
                        )
                        if prefix_is_full_seq and seq_lens_cpu is not None:
                            # min(seq_lens, window) per request: the host mirror's sum, no stream wait.
                            paged_kernel_lens_sum = int(torch.clamp(seq_lens_cpu, max=sliding_window_size).sum())
                        else:
                            paged_kernel_lens_sum = paged_kernel_lens.sum().item()
                        kv_start_idx = seq_lens - paged_kernel_lens
                else:
                    paged_kernel_lens_sum = seq_lens_sum
""")


def test_the_verify_sum_reads_the_mirror():
    assert_codemod(swa.VerifyWindowSumFromMirror, BEFORE, AFTER)


def test_the_window_spelled_as_an_attribute():
    """0.5.10 .. 0.5.13 spell it torch.tensor(self.sliding_window_size) + ... (no fill there);
    a fork with the fill and self.sliding_window_size gets that spelling."""
    src = BEFORE.replace("sliding_window_size + seq_lens", "self.sliding_window_size + seq_lens")
    out = AFTER.replace("sliding_window_size + seq_lens", "self.sliding_window_size + seq_lens").replace(
        "max=sliding_window_size", "max=self.sliding_window_size"
    )
    assert_codemod(swa.VerifyWindowSumFromMirror, src, out)


UPSTREAM = code("""
    class FlashInferIndicesUpdaterPrefill:
        def update_sliding_window(self, seq_lens, seq_lens_cpu, prefix_lens, spec_info):
            if prefix_lens is None:
                prefix_is_full_seq = getattr(spec_info, "num_accept_tokens", None) is None
            else:
                prefix_is_full_seq = False
            if prefix_is_full_seq and seq_lens_cpu is not None:
                paged_kernel_lens_sum = int(torch.clamp(seq_lens_cpu, max=sliding_window_size).sum())
""")
NO_FILL = code("""
    class FlashInferIndicesUpdaterPrefill:
        def update_sliding_window(self, seq_lens, seq_lens_cpu, prefix_lens, spec_info):
            for wrapper_id in range(2):
                paged_kernel_lens = torch.minimum(
                    seq_lens,
                    torch.tensor(self.sliding_window_size) + seq_lens - prefix_lens,
                )
                paged_kernel_lens_sum = paged_kernel_lens.sum().item()
""")


def test_upstream_is_done_and_a_tree_without_the_fill_is_moot():
    assert_state(swa.VerifyWindowSumFromMirror, UPSTREAM, State.DONE)
    finding = detect(swa.VerifyWindowSumFromMirror, NO_FILL)
    assert finding.state is State.SUPERSEDED and finding.moots_patch and "fails before the sum" in finding.detail


def test_a_window_branch_of_another_shape_is_refused():
    other = BEFORE.replace(
        "                    paged_kernel_lens_sum = paged_kernel_lens.sum().item()\n                    kv_start_idx",
        "                    paged_kernel_lens_sum = int(paged_kernel_lens.sum())\n                    kv_start_idx",
    )
    assert other != BEFORE
    finding = detect(swa.VerifyWindowSumFromMirror, other)
    assert finding.state is State.MISSING and "that sum to read the mirror" in finding.detail


@pytest.mark.parametrize("window", [1, 4, 4096])
def test_the_mirror_sum_is_the_device_sum(window):
    """What the edit relies on: with the prefix the whole sequence,
    minimum(seq_lens, window + seq_lens - prefix_lens) is min(seq_lens, window)."""
    torch = pytest.importorskip("torch")
    seq_lens = torch.tensor([1, 3, 4, 5, 17, 4097], dtype=torch.int64)
    device_sum = torch.minimum(seq_lens, window + seq_lens - seq_lens).sum().item()
    assert int(torch.clamp(seq_lens.clone(), max=window).sum()) == device_sum
