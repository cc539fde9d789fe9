"""Issue 71 item 2 (docs/research/flashinfer-spec-v2.md): FlashInfer's plans
need the exact per-row lengths, so a host upper bound (seq-lens-host-bound)
cannot replace the CPU mirror without changing outputs.

A model of the two host schedulers, written from FlashInfer's scheduler.cuh
as that page describes it (PrefillBinarySearchKVChunkSize: the smallest KV
chunk whose split keeps the work items within the grid; MLAPlan: each work
item carries its row's host KV length, which the kernel reads): with a bound
in place of the lengths, the MHA chunk size (so where a row's softmax is cut
and merged) and the MLA work items (so what the kernel attends) change."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def mha_kv_chunk_size(qo_tiles: list[int], kv_lens: list[int], max_items: int, min_chunk: int = 1) -> int:
    """The smallest chunk keeping sum(qo_tiles[i] * ceil(kv_len[i] / chunk)) <= max_items."""
    low, high = min_chunk, max(max(kv_lens), 1)
    while low < high:
        mid = (low + high) // 2
        if sum(q * ceil_div(max(k, 1), mid) for q, k in zip(qo_tiles, kv_lens)) > max_items:
            low = mid + 1
        else:
            high = mid
    return low


def chunks(kv_len: int, chunk: int) -> list[tuple[int, int]]:
    """The KV ranges one row's attention is cut into (clamped to the true length, as the kernel does)."""
    return [(s, min(s + chunk, kv_len)) for s in range(0, kv_len, chunk)]


def mla_work_items(kv_lens: list[int], limit: int) -> list[tuple[int, int, int]]:
    """(row, kv_start, kv_end) per work item, from the host lengths: what the MLA kernel reads."""
    return [(row, s, min(s + limit, n)) for row, n in enumerate(kv_lens) for s in range(0, n, limit)]


EXACT = [130, 1900, 620]
BOUND = [4096, 4096, 4096]  # seq-lens-host-bound's kind of number: each >= the true length


def test_a_bound_moves_where_the_mha_kernel_cuts_a_rows_softmax():
    exact = mha_kv_chunk_size([1, 1, 1], EXACT, max_items=12)
    bound = mha_kv_chunk_size([1, 1, 1], BOUND, max_items=12)
    assert exact != bound
    # The true row (1900 tokens) is split at other places: other partial states, another merge.
    assert chunks(1900, exact) != chunks(1900, bound)


def test_a_fixed_split_size_is_the_only_case_where_a_bound_adds_empty_chunks_only():
    fixed = 256
    real = chunks(1900, fixed)
    planned = [(s, min(s + fixed, 1900)) for s in range(0, 4096, fixed)]
    assert [c for c in planned if c[0] < c[1]] == real  # the extra chunks are empty (chunk_start clamped)


def test_a_bound_changes_what_the_mla_kernel_attends():
    assert mla_work_items(EXACT, 512) != mla_work_items(BOUND, 512)
    assert max(end for _, _, end in mla_work_items(BOUND, 512)) > max(EXACT)  # past every row's end
