"""backends.flashinfer_mla (the runtime of flashinfer-mla-host-plan) on CPU
tensors: the host plan arrays equal what the device path builds, and every
case without exact host lengths gives None (the stock plan)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

PATH = Path(__file__).resolve().parents[2] / "patchkit" / "backends" / "flashinfer_mla.py"


@pytest.fixture(scope="module")
def fm():
    """Loaded by file path, as a vendored tree loads it (no patchkit import)."""
    spec = importlib.util.spec_from_file_location("flashinfer_mla_standalone", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verify_arrays_and_their_absence(fm):
    qo, kv, lens = fm.verify_host_plan(torch.tensor([5, 7, 1, 1]), 3, 4)  # the 4th row past bs is left out
    assert qo.tolist() == [0, 4, 8, 12] and kv.tolist() == [0, 9, 20, 25] and lens.tolist() == [9, 11, 5]
    assert {t.dtype for t in (qo, kv, lens)} == {torch.int32}
    none = (None, None, None)
    assert fm.verify_host_plan(None, 3, 4) == none
    assert fm.verify_host_plan(torch.tensor([5]), 3, 4) == none  # fewer rows than the batch
    assert fm.verify_host_plan(torch.tensor([5, 7, 1]), 3, None) == none


class Mode:
    def __init__(self, v2):
        self.v2 = v2

    def is_draft_extend_v2(self):
        return self.v2


def batch(v2=True, seq_lens=(9, 11), extend=(4, 4)):
    return SimpleNamespace(
        forward_mode=Mode(v2),
        seq_lens_cpu=None if seq_lens is None else torch.tensor(seq_lens),
        extend_seq_lens_cpu=None if extend is None else list(extend),
    )


def test_draft_extend_arrays_and_their_absence(fm):
    qo, kv, lens = fm.draft_extend_host_plan(batch(extend=(4, 2)), False)
    assert qo.tolist() == [0, 4, 6] and kv.tolist() == [0, 9, 20] and lens.tolist() == [9, 11]
    none = (None, None, None)
    assert fm.draft_extend_host_plan(batch(), True) == none  # ragged
    assert fm.draft_extend_host_plan(batch(v2=False), False) == none  # not a spec-v2 draft extend
    assert fm.draft_extend_host_plan(batch(seq_lens=None), False) == none
    assert fm.draft_extend_host_plan(batch(extend=None), False) == none
    assert fm.draft_extend_host_plan(batch(extend=(4,)), False) == none  # lengths disagree
