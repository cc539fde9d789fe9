"""backends.flashinfer_draft_extend_graph on its own: the switch is off by
default (the worker admits nothing), and the replay's host plan is the device
one or refused where it cannot be."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from patchkit.backends import flashinfer_draft_extend_graph as deg  # noqa: E402


class FlashInferAttnBackend:  # the name the admission knows (a subclass that keeps its methods counts)
    dispatch_reason = None
    skip_prefill = False

    def init_forward_metadata_capture_cuda_graph(self):
        pass

    def init_forward_metadata_replay_cuda_graph(self):
        pass


class VendorBackend(FlashInferAttnBackend):
    pass


class TRTLLMHAAttnBackend(FlashInferAttnBackend):  # upstream's subclass with graph metadata of its own
    def init_forward_metadata_capture_cuda_graph(self):
        pass


def test_the_switch_is_off_by_default(monkeypatch):
    """Until a GPU run compares outputs, no FlashInfer backend joins the draft-extend graph."""
    monkeypatch.delenv(deg.SWITCH, raising=False)
    assert deg.SWITCH == "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH"
    assert not deg.switched_on() and deg.admits_flashinfer_draft_extend(FlashInferAttnBackend()) is False
    for value in ("0", "true", "yes", ""):
        monkeypatch.setenv(deg.SWITCH, value)
        assert deg.admits_flashinfer_draft_extend(FlashInferAttnBackend()) is False
    monkeypatch.setenv(deg.SWITCH, "1")
    assert deg.admits_flashinfer_draft_extend(FlashInferAttnBackend()) is True
    assert deg.admits_flashinfer_draft_extend(VendorBackend()) is True
    assert deg.admits_flashinfer_draft_extend(TRTLLMHAAttnBackend()) is False  # trtllm-mha-draft-extend-v2's


@pytest.mark.parametrize(
    "backend",
    [
        None,
        SimpleNamespace(dispatch_reason=None, skip_prefill=False),  # not FlashInfer
        type("FlashInferAttnBackend", (FlashInferAttnBackend,), {"dispatch_reason": "SLIDING_WINDOW"})(),
        type("FlashInferAttnBackend", (FlashInferAttnBackend,), {"skip_prefill": True})(),
    ],
)
def test_switched_on_only_a_one_wrapper_flashinfer_with_prefill_buffers_is_admitted(monkeypatch, backend):
    monkeypatch.setenv(deg.SWITCH, "1")
    assert deg.admits_flashinfer_draft_extend(backend) is False


def backend(strides):
    return SimpleNamespace(dispatch_reason=None, **{deg.STRIDES: strides})


def test_the_replay_plan_is_the_device_one_padded_rows_included():
    lens = torch.tensor([9, 4, 1, 1], dtype=torch.int32)  # two live rows, two padded (fill value 1)
    plan = deg.replay_host_plan(backend({4: 3}), 4, lens, 15)
    assert plan.qo_indptr.tolist() == [0, 3, 6, 9, 12]  # cumsum(seq_lens - (seq_lens - 3))
    assert plan.kv_indptr.tolist() == [0, 9, 13, 14, 15] and plan.last_page_len.tolist() == [1] * 4
    assert plan.kv_len_sum == 15 and all(t.dtype == torch.int32 for t in plan[:3])
    # the K lengths too, as flashinfer-host-indptr's paged plan hands them to plan() (2026-11-28f)
    assert plan.kv_lens.tolist() == lens.tolist() and plan.kv_lens.dtype == torch.int32


@pytest.mark.parametrize(
    "strides, lens, total, why",
    [
        ({4: 3}, None, 15, "no mirror"),
        ({4: 3}, torch.tensor([9, 4, 1, 1]), 16, "a stale mirror"),
        ({4: 3}, torch.tensor([9, 4, 1]), 14, "a short mirror"),
        ({4: 3}, torch.tensor([9, 4, 1, 1]), None, "no seq_lens_sum"),
        ({}, torch.tensor([9, 4, 1, 1]), 15, "not captured here"),
    ],
)
def test_the_replay_plan_is_refused_where_it_cannot_equal_the_device(strides, lens, total, why):
    assert deg.replay_host_plan(backend(strides), 4, lens, total) is None, why


def test_two_wrappers_keep_the_stock_plan():
    be = SimpleNamespace(dispatch_reason="CROSS_ATTENTION", **{deg.STRIDES: {2: 2}})
    assert deg.replay_host_plan(be, 2, torch.tensor([3, 4]), 7) is None


def test_the_sync_free_plan_runs_only_for_the_replays_own_host_plan():
    stock = []
    wrapper = SimpleNamespace(patchkit_host_plan=None)
    args = (torch.zeros(3), torch.zeros(3), torch.zeros(4), torch.ones(2), 8, 2, 64, 1)
    deg.sync_free_plan(wrapper, lambda *a, **k: stock.append(a), *args)
    assert len(stock) == 1  # no host plan on the wrapper: plan() itself
    wrapper.patchkit_host_plan = deg.HostPlan(torch.zeros(3), torch.zeros(3), torch.ones(2), 0, torch.zeros(2))
    deg.sync_free_plan(wrapper, lambda *a, **k: stock.append(a), *args)
    assert len(stock) == 2  # equal numbers, other tensors: still plan()
