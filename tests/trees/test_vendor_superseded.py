"""A vendor's own version of the change is superseded, not a conflict (issue
45 §3): a fork whose filter_batch already drops the mirror for spec v2 and
refreshes seq_lens_sum from the requests (no device sync) gets one note naming
its line, and needs-cpu-seq-lens applies; a codemod that would remove vendor
code still refuses."""

from __future__ import annotations

import pytest
from support import PRIMARY, patch_states

from patchkit.codemods.common.base import State
from patchkit.codemods.needs_cpu_seq_lens_deferred_sum import DeferFilterBatchSum
from patchkit.testing import apply, detect

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


BATCH = "srt/managers/schedule_batch.py"


def fork(tree, body: str) -> None:
    path = tree / BATCH
    text = path.read_text()
    old_cpu = "        self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]\n"
    old_sum = "        self.seq_lens_sum = self.seq_lens.sum().item()\n"
    assert text.count(old_cpu) == 1 and text.count(old_sum) == 1
    text = text.replace(old_cpu, "").replace(old_sum, body + "\n")
    text = text.replace("    def filter_batch(", "    is_spec_v2 = False\n\n    def filter_batch(", 1)
    path.write_text(text)


@pytest.mark.trees
def test_fork_with_its_own_deferral_gets_every_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    fork(tree, VENDOR)
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    states = patch_states(cli, tree)
    assert states["needs-cpu-seq-lens"]["state"] == "applied"
    notes = [n for n in states["needs-cpu-seq-lens"]["notes"] if "without a device sync itself" in n]
    assert len(notes) == 1 and f"{BATCH}:" in notes[0] and "sum(len(r.origin_input_ids)" in notes[0]
    text = (tree / BATCH).read_text()
    assert "self.seq_lens_sum = sum(len(r.origin_input_ids) + len(r.output_ids) for r in self.reqs)" in text
    assert cli("verify", "-q", tree).exit_code == 0


@pytest.mark.trees
def test_vendor_code_a_codemod_would_remove_still_refuses(make_tree, cli):
    tree = make_tree(PRIMARY)
    fork(tree, VENDOR.replace("self.seq_lens_cpu.sum().item()", "self.seq_lens.sum().item() + self.acme_bias"))
    result = cli("apply", tree)
    assert result.exit_code == 1
    assert (
        "not applied: needs-cpu-seq-lens: " in result.output
        and "needs_cpu_seq_lens_deferred_sum.DeferFilterBatchSum (patch needs-cpu-seq-lens) would remove code the vendor added"
        in result.output
    )


# -- each codemod that can meet a vendor's own version (base.vendors_own: one note, the vendor's line) --

from patchkit.codemods import min_new_tokens_no_sync as mnt  # noqa: E402
from patchkit.codemods import needs_cpu_seq_lens_sync as sync  # noqa: E402
from patchkit.testing import run  # noqa: E402

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


PENALTY_FILE = "srt/sampling/penaltylib/min_new_tokens.py"


@pytest.mark.trees
def test_fork_with_its_own_penalty_select_gets_every_other_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    path = tree / PENALTY_FILE
    text = path.read_text()
    old = "logits[mask] += self.stop_token_penalties[mask]"
    assert text.count(old) == 1
    path.write_text(text.replace(old, "logits += torch.where(mask, self.stop_token_penalties, 0.0)  # acme"))
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    states = patch_states(cli, tree)
    mine = states["min-new-tokens-no-sync"]  # its output-id copies (issue 53) still apply
    assert mine["state"] == "applied" and len(mine["notes"]) == 1
    assert f"{PENALTY_FILE}:" in mine["notes"][0] and "logits += torch.where(" in mine["notes"][0]
    others = {pid: p["state"] for pid, p in states.items() if pid != "min-new-tokens-no-sync"}
    assert set(others.values()) <= {"applied", "native", "not-applicable"} and "applied" in others.values()
    assert path.read_text().count("# acme") == 1


from patchkit.codemods import fa3_spec_v2 as fa3  # noqa: E402

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
