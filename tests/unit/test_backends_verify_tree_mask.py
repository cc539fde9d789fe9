"""patchkit.backends.verify_tree_mask on CPU: which batches the preallocated
verify tree mask fits (issue 29 §3, the bound of sglang #33127)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from support import import_cost

from patchkit.backends import fa3, trtllm_mla
from patchkit.backends import verify_tree_mask as vtm

torch = pytest.importorskip("torch")

D, C, MAX_BS = 4, 64, 2  # draft tokens, max context, captured batch size


def test_module_imports_fast_and_light():
    heavy, seconds = import_cost("patchkit.backends.verify_tree_mask")
    assert heavy == [] and seconds < 2.0  # a loaded CI machine: the bound catches a heavy import, not jitter


def test_full_mask_numel_is_what_the_kernel_writes_at_most():
    # FULL_MASK: per request D rows of (seq_len + D); seq_len <= C.
    seq_lens = [C, C, C]
    written = D * sum(seq_lens) + len(seq_lens) * D * D
    assert vtm.full_mask_numel(3, D, C) == written == 816


def the_mask(alloc):
    if alloc is fa3.alloc_verify_tree_mask:
        return alloc(
            max_num_tokens=MAX_BS * D,
            max_context_len=C,
            num_draft_tokens=D,
            skip_prefill=False,
            is_draft_runner=False,
            device="cpu",
        )
    return alloc(max_num_tokens=MAX_BS * D, max_context_len=C, num_draft_tokens=D, skip_prefill=False, device="cpu")


@pytest.mark.parametrize("alloc", [fa3.alloc_verify_tree_mask, trtllm_mla.alloc_cuda_graph_custom_mask])
def test_a_batch_above_the_captured_size_gets_none(alloc):
    """D=4, C=64, max_bs=2, bs=3: the captured mask holds 544 cells, the batch
    may write 816. Before the guard the worker handed it over anyway."""
    mask = the_mask(alloc)
    target = NS(verify_tree_mask_max_bs=MAX_BS, max_context_len=C)
    assert mask.numel() == vtm.full_mask_numel(MAX_BS, D, C) == 544
    handed = vtm.verify_tree_mask_for_batch(mask, target, torch.full((3,), C), D)
    assert handed is None or handed.numel() >= vtm.full_mask_numel(3, D, C)
    assert handed is None


@pytest.mark.parametrize("bs", [1, MAX_BS])
def test_a_batch_within_the_captured_size_reuses_it(bs):
    mask = the_mask(fa3.alloc_verify_tree_mask)
    target = NS(verify_tree_mask_max_bs=MAX_BS, max_context_len=C)
    assert vtm.verify_tree_mask_for_batch(mask, target, torch.full((bs,), C), D) is mask


def test_a_mask_smaller_than_its_recorded_max_bs_needs_is_refused():
    """Both bounds: bs within max_bs, and the buffer covering the batch's worst case."""
    short = torch.zeros(vtm.full_mask_numel(MAX_BS, D, C) - 1, dtype=torch.bool)
    target = NS(verify_tree_mask_max_bs=MAX_BS, max_context_len=C)
    assert vtm.verify_tree_mask_for_batch(short, target, torch.full((MAX_BS,), C), D) is None
    assert vtm.verify_tree_mask_for_batch(short, target, torch.full((1,), C), D) is short


def test_no_mask_stays_none():
    target = NS(verify_tree_mask_max_bs=MAX_BS, max_context_len=C)
    assert vtm.verify_tree_mask_for_batch(None, target, torch.full((1,), C), D) is None


def test_a_backend_recording_no_bound_keeps_its_own_contract():
    """Pristine Triton, upstream's own hooks: their buffer as they returned it."""
    mask = torch.zeros(8, dtype=torch.uint8)
    assert vtm.verify_tree_mask_for_batch(mask, NS(max_context_len=C), torch.full((64,), C), D) is mask


@pytest.mark.parametrize(
    "max_bs, bs, fits", [(None, 1, False), (2, 3, False), (2, 2, True), (2, 0, True), (4, 3, True)]
)
def test_tree_mask_fits(max_bs, bs, fits):
    mask = torch.zeros(vtm.full_mask_numel(max_bs or 0, D, C), dtype=torch.bool)
    assert vtm.tree_mask_fits(mask, max_bs, bs, D, C) is fits
    assert vtm.tree_mask_fits(None, max_bs, bs, D, C) is False
