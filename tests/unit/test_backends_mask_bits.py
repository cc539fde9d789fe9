"""backends.mask_bits: FlashInfer's segment packing from host lengths. The torch ops equal
numpy.packbits per segment; the Triton kernel equals the torch ops under Triton's CPU
interpreter (TRITON_INTERPRET=1, in a subprocess: the flag is read when the kernel is made)."""

from __future__ import annotations

import pytest
from support import import_cost, under_triton_interpreter

from patchkit.backends import mask_bits

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


def test_module_imports_fast_and_light():
    heavy, seconds = import_cost("patchkit.backends.mask_bits")
    assert heavy == [] and seconds < 2.0


def _packbits(mask, bits):
    expected, offsets, start = [], [0], 0
    for n in bits:
        expected += list(np.packbits(mask[start : start + n].numpy().astype(np.uint8), bitorder="little")) if n else []
        offsets.append(len(expected))
        start += n
    return expected, offsets


@pytest.mark.parametrize("seed", range(4))
def test_the_torch_ops_equal_packbits_per_segment(seed):
    gen = np.random.default_rng(seed)
    bits = [int(n) for n in gen.integers(0, 3000, size=int(gen.integers(0, 9)))]
    mask = torch.from_numpy(gen.random(sum(bits) + 5) < 0.5)
    packed, indptr = mask_bits.pack_mask_segments_reference(mask, bits)
    assert (packed.tolist(), indptr.tolist()) == _packbits(mask, bits) and indptr.dtype == torch.int32


def test_without_a_gpu_or_the_interpreter_the_torch_ops_pack(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mask = torch.ones(40, dtype=torch.bool)
    packed, indptr = mask_bits.pack_mask_segments(mask, [9, 0, 16, 3])
    assert packed.tolist() == [255, 1, 255, 255, 7] and indptr.tolist() == [0, 2, 2, 4, 5]
    empty, indptr = mask_bits.pack_mask_segments(mask, [0, 0])
    assert empty.numel() == 0 and indptr.tolist() == [0, 0, 0]


def test_the_triton_kernel_matches_the_torch_ops_under_the_interpreter():
    pytest.importorskip("triton")
    script = (
        "import numpy as np, torch\n"
        "from patchkit.backends import mask_bits as mb\n"
        "gen = np.random.default_rng(7)\n"
        "cases = [[9, 0, 16, 3], [1], [0, 5], [2051, 8, 1030, 0, 7], [4 * 520] * 3]\n"
        "cases += [[int(n) for n in gen.integers(0, 2500, size=6)] for _ in range(3)]\n"
        "for bits in cases:\n"
        "    mask = torch.from_numpy(gen.random(sum(bits) + 3) < 0.5)\n"
        "    got, got_indptr = mb.pack_mask_segments(mask, bits)\n"
        "    assert mb._kernel not in (None, False)\n"
        "    want, want_indptr = mb.pack_mask_segments_reference(mask, bits)\n"
        "    assert torch.equal(got, want) and torch.equal(got_indptr, want_indptr), bits\n"
        "print('same')\n"
    )
    assert under_triton_interpreter(script) == "same"
