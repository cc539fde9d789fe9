"""patchkit.backends.mirror_reads and patchkit.backends.fa3 on CPU tensors (the GPU
twin is tests/gpu/test_gpu_fa3.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import import_cost

from patchkit.backends import fa3, mirror_reads

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("module", ["patchkit.backends.fa3", "patchkit.backends.mirror_reads"])
def test_modules_import_fast_and_light(module):
    """Patched sglang imports them: stdlib only at import time (torch lazily)."""
    heavy, seconds = import_cost(module)
    assert heavy == [] and seconds < 2.0  # a loaded CI machine: the bound catches a heavy import, not jitter


# -- reads of the mirror ------------------------------------------------------------------


def test_host_max_is_the_mirror_max_when_there():
    value = mirror_reads.host_max_seq_len(torch.tensor([5, 17, 3]), bound=4096)
    assert value == 17 and isinstance(value, int)


def test_host_max_is_the_static_bound_without_the_mirror():
    assert mirror_reads.host_max_seq_len(None, bound=4096) == 4096


def test_rows_or_none():
    mirror = torch.tensor([1, 2, 3, 4])
    assert mirror_reads.rows_or_none(mirror, 2).tolist() == [1, 2]
    assert mirror_reads.rows_or_none(None, 2) is None


def test_rows_max_from_the_mirror_or_the_device_lengths():
    device_lens = torch.tensor([9, 40, 2])
    assert mirror_reads.rows_max(torch.tensor([7, 8, 99]), device_lens, 2) == 8
    assert mirror_reads.rows_max(None, device_lens, 2) == 40
    assert mirror_reads.rows_max(None, device_lens, 3) == 40


@pytest.mark.parametrize("lens, expected", [([0, 0], False), ([0, 3], True), ([], False), (None, False)])
def test_any_host_lens(lens, expected):
    assert mirror_reads.any_host_lens(lens) is expected


def test_max_host_lens():
    assert mirror_reads.max_host_lens([2, 5, 1], fixed=4) == 5
    assert mirror_reads.max_host_lens(None, fixed=4) == 4


def test_mirror_or_none_hides_the_stale_pinned_buffer():
    pinned = torch.tensor([111, 222])  # lengths of an earlier batch
    assert mirror_reads.mirror_or_none(None, pinned) is None
    fresh = torch.tensor([3, 4])
    assert mirror_reads.mirror_or_none(fresh, pinned) is pinned


# -- page-table width ----------------------------------------------------------------------


def test_pages_within_keeps_the_count_inside_the_table():
    table = torch.zeros(4, 256, dtype=torch.int32)  # ceil(4096 / 16) pages
    assert mirror_reads.pages_within(10, table) == 10
    assert mirror_reads.pages_within(256, table) == 256
    # static bound 4096 + 1 draft step, page size 16: 257 pages, the table has 256
    assert mirror_reads.pages_within((4096 + 1 + 15) // 16, table) == 256


# -- the verify tree mask ------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_draft_tokens, skip_prefill, is_draft_runner, expected",
    [
        (4, False, False, True),
        (1, False, False, True),
        (None, False, False, False),
        (0, False, False, False),
        (4, True, False, False),  # a draft step backend
        (4, False, True, False),  # the draft worker's draft-extend backend (#31527)
    ],
)
def test_only_the_target_backend_verifies(num_draft_tokens, skip_prefill, is_draft_runner, expected):
    assert fa3.needs_verify_tree_mask(num_draft_tokens, skip_prefill, is_draft_runner) is expected


def test_mask_numel():
    assert fa3.verify_tree_mask_numel(16, 256, 4) == 16 * 260


def alloc(**overrides):
    kwargs = dict(
        max_num_tokens=16,
        max_context_len=256,
        num_draft_tokens=4,
        skip_prefill=False,
        is_draft_runner=False,
        device="cpu",
    )
    kwargs.update(overrides)
    return fa3.alloc_verify_tree_mask(**kwargs)


def test_alloc_is_a_zeroed_bool_buffer_of_the_worst_case():
    mask = alloc()
    assert mask.dtype == torch.bool and mask.shape == (16 * 260,) and mask.device.type == "cpu"
    assert not mask.any()


@pytest.mark.parametrize(
    "overrides", [dict(num_draft_tokens=None), dict(skip_prefill=True), dict(is_draft_runner=True)]
)
def test_no_mask_where_there_is_no_verify(overrides):
    assert alloc(**overrides) is None


def test_no_mask_is_decided_without_importing_torch():
    code = (
        "import sys; from patchkit.backends import fa3; "
        "r = fa3.alloc_verify_tree_mask(max_num_tokens=4, max_context_len=8, num_draft_tokens=2, "
        "skip_prefill=False, is_draft_runner=True, device='cpu'); print(r, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "False"]


def test_the_worst_case_holds_every_full_mask_layout():
    """build_tree_kernel_efficient's FULL_MASK layout: per request, num_draft
    rows of (seq_len + num_draft) entries, requests one after another. The
    preallocated buffer holds it for any lengths up to max_context_len."""
    max_bs, num_draft, context = 4, 4, 256
    mask = alloc(max_num_tokens=max_bs * num_draft, max_context_len=context, num_draft_tokens=num_draft)
    longest = sum((context + num_draft) * num_draft for _ in range(max_bs))
    assert longest == mask.numel()


def test_verify_buffers():
    mask = alloc()
    assert fa3.verify_buffers(mask)[0] is mask and fa3.verify_buffers(mask)[1] is None
    assert fa3.verify_buffers(None) == [None, None]
