"""patchkit.backends.flashmla (and mirror_reads.plus_or_none) on CPU tensors."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from support import import_cost

from patchkit.backends import flashmla, mirror_reads

torch = pytest.importorskip("torch")


def test_module_imports_fast_and_light():
    """Patched sglang imports it: stdlib only at import time (torch lazily)."""
    heavy, seconds = import_cost("patchkit.backends.flashmla")
    assert heavy == [] and seconds < 2.0  # a loaded CI machine: the bound catches a heavy import, not jitter


def test_plus_or_none():
    assert mirror_reads.plus_or_none(torch.tensor([5, 9]), 4).tolist() == [9, 13]
    assert mirror_reads.plus_or_none(None, 4) is None


def test_draft_extend_k_lengths():
    """Spec v2's uniform extend: K = seq_lens (which already hold the window);
    a shorter extend is padded to the window, as upstream does."""
    seq_lens = torch.tensor([70, 9])
    k = flashmla.draft_extend_seq_lens_k(seq_lens, torch.tensor([4, 4]), 4)
    assert k.dtype == torch.int32 and k.tolist() == [70, 9]
    assert flashmla.draft_extend_seq_lens_k(seq_lens, torch.tensor([4, 1]), 4).tolist() == [70, 12]


def mode(draft_extend_v2):
    return NS(is_draft_extend_v2=lambda: draft_extend_v2)


def test_fixed_q_cache_seqlens():
    k = torch.tensor([70, 9], dtype=torch.int32)
    fb = NS(forward_mode=mode(True), seq_lens=torch.tensor([70, 9]))
    assert flashmla.fixed_q_cache_seqlens(fb, NS(seq_lens_k=k), 4) is k
    fb = NS(forward_mode=mode(False), seq_lens=torch.tensor([70, 9]))
    out = flashmla.fixed_q_cache_seqlens(fb, NS(), 4)
    assert out.dtype == torch.int32 and out.tolist() == [74, 13]  # target verify, as before
