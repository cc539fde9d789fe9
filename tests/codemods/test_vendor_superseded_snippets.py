"""Snippet tests of tests/trees/test_vendor_superseded.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.codemods import fa3_spec_v2 as fa3  # noqa: E402
from patchkit.codemods import min_new_tokens_no_sync as mnt  # noqa: E402
from patchkit.codemods import needs_cpu_seq_lens_sync as sync  # noqa: E402
from patchkit.codemods.common.base import State
from patchkit.codemods.needs_cpu_seq_lens_deferred_sum import DeferFilterBatchSum
from patchkit.testing import (
    apply,
    detect,
    run,  # noqa: E402
)

FILTER = """
class ScheduleBatch:
    def filter_batch(self, keep_indices):
        self.seq_lens = self.seq_lens[keep_indices]
{body}
"""


RELEASE = "        self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]\n        self.seq_lens_sum = self.seq_lens.sum().item()"


VENDOR = (
    "        if self.is_spec_v2:\n"
    "            self.seq_lens_cpu = None\n"
    "            self.seq_lens_sum = sum(len(r.origin_input_ids) + len(r.output_ids) for r in self.reqs)\n"
    "        else:\n"
    "            self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]\n"
    "            self.seq_lens_sum = self.seq_lens_cpu.sum().item()"
)


def test_release_shape_is_still_to_do():
    src = FILTER.format(body=RELEASE)
    assert detect(DeferFilterBatchSum, src).state is State.TODO
    assert "self.seq_lens_sum = None" in apply(DeferFilterBatchSum, src)


def test_vendor_sum_without_a_device_sync_is_superseded_with_its_line():
    finding = detect(DeferFilterBatchSum, FILTER.format(body=VENDOR))
    assert finding.state is State.SUPERSEDED and finding.by_tree
    assert "line 6 (`self.seq_lens_sum = sum(len(r.origin_input_ids)" in finding.detail


def test_a_device_sum_on_any_branch_is_still_to_do():
    body = VENDOR.replace("self.seq_lens_cpu.sum().item()", "self.seq_lens.sum().item()")
    assert detect(DeferFilterBatchSum, FILTER.format(body=body)).state is State.TODO


PENALTY = """
class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
    def _apply(self, logits: torch.Tensor):
        mask = self.len_output_tokens < self.min_new_tokens
        {body}
"""


@pytest.mark.parametrize(
    "body",
    [
        "logits += torch.where(mask, self.stop_token_penalties, 0.0)",
        "logits.copy_(torch.where(mask, logits + self.stop_token_penalties, logits))",
    ],
)
def test_min_new_tokens_vendor_select_is_superseded_with_its_line(body):
    src = PENALTY.format(body=body)
    finding = detect(mnt.AddPenaltyWithoutSync, src)
    assert finding.state is State.SUPERSEDED and finding.by_tree
    assert finding.detail == (
        f"this tree adds the stop-token penalties without a host sync itself at line 4 (`{body}`); "
        "patchkit leaves it as it is"
    )
    before, after, again = run(mnt.AddPenaltyWithoutSync, src)
    assert after == src.lstrip("\n") and before is again is State.SUPERSEDED  # nothing changed


def test_min_new_tokens_ours_and_upstreams_stay_done():
    src = PENALTY.format(body="logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))")
    finding = detect(mnt.AddPenaltyWithoutSync, src)
    assert finding.state is State.DONE and not finding.by_tree


def test_decode_sync_dropped_by_the_vendor_names_its_line():
    src = """
class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        batch.maybe_wait_verify_done()
        batch.seq_lens_cpu = None  # acme: filled lazily
"""
    finding = detect(sync.GateDecodeSync, src)
    assert finding.state is State.SUPERSEDED and finding.by_tree
    assert (
        finding.detail
        == "this tree avoids the seq_lens sync itself at line 4 (`batch.seq_lens_cpu = None`); patchkit leaves it as it is"
    )


OPTED_OUT = """
class FlashAttentionBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__()
        self.needs_cpu_seq_lens = False  # acme: no host mirror on our kernels
"""


def test_opt_out_declared_per_instance_by_the_vendor_is_superseded_with_its_line():
    finding = detect(fa3.BackendOptsOut, OPTED_OUT)
    assert finding.state is State.SUPERSEDED and finding.by_tree
    assert finding.detail == (
        "this tree opts FlashAttentionBackend out of the CPU mirror (per instance) itself at line 4 "
        "(`self.needs_cpu_seq_lens = False`); patchkit leaves it as it is"
    )


def test_an_instance_value_other_than_false_is_still_to_do():
    src = OPTED_OUT.replace("self.needs_cpu_seq_lens = False", "self.needs_cpu_seq_lens = acme_flag")
    assert detect(fa3.BackendOptsOut, src).state is State.TODO


VENDOR_GATE = """
class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        batch.maybe_wait_verify_done()
        if self.acme_keeps_mirror:
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()
        else:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
"""


def test_decode_sync_gated_by_the_vendor_is_superseded_with_its_line():
    finding = detect(sync.GateDecodeSync, VENDOR_GATE)
    assert finding.state is State.SUPERSEDED and finding.by_tree
    assert finding.detail == (
        "this tree skips the seq_lens sync on a branch itself at line 8 "
        "(`batch.seq_lens_cpu = None`); patchkit leaves it as it is"
    )


def test_decode_sync_nested_without_a_branch_dropping_the_mirror_is_still_gated():
    src = VENDOR_GATE.split("        else:")[0]
    assert detect(sync.GateDecodeSync, src).state is State.TODO
