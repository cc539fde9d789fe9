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


class Recording:
    def __init__(self):
        self.plans = []

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))


def draft_batch(seq_lens_cpu, bs, draft=True):
    return SimpleNamespace(
        seq_lens_cpu=seq_lens_cpu, batch_size=bs, spec_info=SimpleNamespace(is_draft_input=lambda: draft)
    )


def test_a_draft_decode_wrapper_plans_one_row_a_request_from_the_mirror(fm):
    lens = torch.tensor([5, 2, 8])
    inner = Recording()
    wrapper = fm.draft_decode_planned(inner, draft_batch(lens, 3))
    device = torch.arange(4, dtype=torch.int32), torch.tensor([0, 5, 7, 15], dtype=torch.int32)
    wrapper.plan(device[0], device[1], "indices", lens.to(torch.int32), 16, causal=False)
    (qo, kv, indices, kv_len, heads), kw = inner.plans[0]
    assert qo is not device[0] and torch.equal(qo, device[0]) and torch.equal(kv, device[1])
    assert torch.equal(kv_len, lens.to(torch.int32)) and (indices, heads, kw) == ("indices", 16, {"causal": False})
    # another batch handed to it (a length that is not this batch's): the arrays as given
    wrapper.plan(device[0][:3], device[1][:3], "indices", lens[:2], 16)
    assert inner.plans[1][0][0] is not qo and len(inner.plans[1][0][0]) == 3


@pytest.mark.parametrize(
    "batch",
    [
        draft_batch(torch.tensor([5, 2]), 2, draft=False),  # a plain decode
        draft_batch(None, 2),  # no mirror
        draft_batch(torch.tensor([5, 2, 1]), 2),  # a mirror of another batch
        SimpleNamespace(seq_lens_cpu=torch.tensor([5, 2]), batch_size=2, spec_info=None),
    ],
)
def test_any_other_decode_keeps_its_wrapper(fm, batch):
    inner = Recording()
    assert fm.draft_decode_planned(inner, batch) is inner


def test_the_eager_verify_plan_is_the_replays_from_the_batchs_mirror(fm):
    lens = torch.tensor([6, 1])
    batch = SimpleNamespace(seq_lens_cpu=lens, batch_size=2, spec_info=SimpleNamespace(draft_token_num=3))
    qo, kv, kv_len = fm.eager_verify_host_plan(batch)
    assert qo.tolist() == [0, 3, 6] and kv.tolist() == [0, 9, 13] and kv_len.tolist() == [9, 4]
    assert fm.eager_verify_host_plan(SimpleNamespace(seq_lens_cpu=None, batch_size=2, spec_info=batch.spec_info)) == (
        None,
        None,
        None,
    )
