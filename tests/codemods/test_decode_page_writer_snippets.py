"""Snippet tests of tests/trees/test_decode_page_writer.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

CUT = fa3.DecodePageWriterStopsAtLivePages


KERNEL = """
@triton.jit
def _fused_metadata_kernel_ps1_no_swa(seq_lens, seq_lens_stride_0, page_table, max_seq_pages, seq_len_delta: tl.constexpr, BLOCK_COLS: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_c = tl.program_id(1)
    i = pid_b
    col_offsets = pid_c * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = col_offsets < max_seq_pages
    tl.store(page_table + i * 8 + col_offsets, col_offsets, mask=mask)
"""


def test_the_column_mask_also_stops_at_the_rows_live_pages():
    out = apply(CUT, KERNEL)
    assert "live_pages = tl.load(seq_lens + i * seq_lens_stride_0).to(tl.int32) + seq_len_delta\n" in out
    assert "mask = (col_offsets < max_seq_pages) & (col_offsets < live_pages)" in out
    assert detect(CUT, out).state is State.DONE


def test_paged_kernels_count_pages():
    paged = KERNEL.replace("_ps1_no_swa(", "_general(").replace(
        "seq_len_delta: tl.constexpr,", "page_size: tl.constexpr, seq_len_delta: tl.constexpr,"
    )
    out = apply(CUT, paged)
    assert "+ seq_len_delta + page_size - 1) // page_size" in out


def test_upstreams_own_guard_is_done():
    upstream = KERNEL.replace(
        "    mask = col_offsets < max_seq_pages\n",
        "    num_live_pages = tl.minimum(tl.load(seq_lens + i) + seq_len_delta, max_seq_pages)\n"
        "    mask = col_offsets < num_live_pages\n",
    )
    assert detect(CUT, upstream).state is State.DONE


def test_a_kernel_without_the_rows_length_is_a_missing_anchor():
    fork = KERNEL.replace("seq_lens, seq_lens_stride_0, ", "lens, lens_stride, ")
    finding = detect(CUT, fork)
    assert finding.state is State.MISSING and "seq_lens" in finding.detail


def test_fa3_module_without_the_kernels_says_where_they_are():
    assert (
        detect(fa3.FA3DecodePageWriterStopsAtLivePages, "class FlashAttentionBackend:\n    pass\n").state
        is State.SUPERSEDED
    )
