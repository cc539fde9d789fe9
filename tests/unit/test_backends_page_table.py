"""patchkit.backends.page_table on CPU: the Triton kernel under Triton's
interpreter (TRITON_INTERPRET=1, in a subprocess: the flag is read at import)
and the torch reference, against a plain full-width gather."""

from __future__ import annotations

import pytest
from support import import_cost, under_triton_interpreter

from patchkit.backends import page_table as pt

torch = pytest.importorskip("torch")


def test_module_imports_fast_and_light():
    heavy, seconds = import_cost("patchkit.backends.page_table")
    assert heavy == [] and seconds < 2.0  # a loaded CI machine: the bound catches a heavy import, not jitter


def _batch(page_size):
    gen = torch.Generator().manual_seed(page_size)
    req_to_token = torch.randint(0, 1 << 20, (6, 5000), dtype=torch.int32, generator=gen)
    req_pool_indices = torch.tensor([3, 0, 5, 1])
    kv_lens = torch.tensor([1, 4999, 0, 130], dtype=torch.int32)
    width = -(-5000 // page_size)
    return req_to_token, req_pool_indices, kv_lens, torch.full((5, width), -7, dtype=torch.int32)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_rows_stop_at_their_real_length(page_size):
    req_to_token, idx, lens, table = _batch(page_size)
    full = req_to_token[idx[:, None], torch.arange(0, 5000, page_size)[None, :]] // page_size  # the old gather
    assert pt.fill_page_table_rows(req_to_token, idx, lens, table, page_size) is True
    for row in range(4):
        live = pt.live_pages(int(lens[row]), page_size, table.shape[1])
        assert torch.equal(table[row, :live], full[row, :live])
        assert (table[row, live:] == -7).all()  # never read, never written
    assert (table[4] == -7).all()  # rows past the batch untouched


def test_sliding_window_tables_are_declined():
    req_to_token, idx, lens, table = _batch(1)
    assert pt.fill_page_table_rows(req_to_token, idx, lens, table, 1, swa_page_table=table.clone()) is False
    assert (table == -7).all()


def test_a_table_too_short_is_one_line():
    req_to_token, idx, lens, table = _batch(1)
    with pytest.raises(ValueError, match="page table has 2 rows for a batch of 4"):
        pt.fill_page_table_rows(req_to_token, idx, lens, table[:2], 1)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_the_eager_table_is_new_full_width_and_rows_stop_at_their_length(page_size):
    """The eager metadata's table (sglang #28106's eager half): a fresh int32
    table as many pages wide as a req_to_token row, what the old gather and
    its striding gave up to each row's live pages, zeros after."""
    req_to_token, idx, lens, _ = _batch(page_size)
    table = pt.eager_page_table(req_to_token, idx, lens, page_size)
    assert table.shape == (4, -(-5000 // page_size)) and table.dtype == torch.int32
    old = req_to_token[idx, :5000][:, torch.arange(0, 5000, page_size)] // page_size  # gather, then stride
    for row in range(4):
        live = pt.live_pages(int(lens[row]), page_size, table.shape[1])
        assert torch.equal(table[row, :live], old[row, :live])
        assert (table[row, live:] == 0).all()
    assert pt.eager_page_table(req_to_token, idx[:0], lens[:0], page_size).shape == (0, table.shape[1])  # idle


def test_the_triton_kernel_matches_the_reference_under_the_interpreter():
    pytest.importorskip("triton")
    script = (
        "import torch\n"
        "from patchkit.backends import page_table as pt\n"
        "assert pt._interpreting()\n"
        "r2t = torch.randint(0, 1 << 20, (6, 3000), dtype=torch.int32)\n"
        "idx = torch.tensor([3, 0, 5, 1]); lens = torch.tensor([1, 2999, 0, 1030], dtype=torch.int32)\n"
        "for page in (1, 16):\n"
        "    a = torch.full((4, -(-3000 // page)), -7, dtype=torch.int32); b = a.clone()\n"
        "    pt.fill_page_table_rows(r2t, idx, lens, a, page)\n"
        "    assert pt._kernel not in (None, False)\n"
        "    pt.fill_page_table_rows_reference(r2t, idx, lens, b, page)\n"
        "    assert torch.equal(a, b), page\n"
        "print('same')\n"
    )
    assert under_triton_interpreter(script) == "same"
