"""A vendor's own version of the change is superseded, not a conflict (issue
45 §3): a fork whose filter_batch already drops the mirror for spec v2 and
refreshes seq_lens_sum from the requests (no device sync) gets one note naming
its line, and needs-cpu-seq-lens applies; a codemod that would remove vendor
code still refuses."""

from __future__ import annotations

import pytest

from patchkit.codemods.common.base import State
from patchkit.codemods.needs_cpu_seq_lens_deferred_sum import DeferFilterBatchSum
from patchkit.testing import apply, detect
from support import PRIMARY, patch_states

FILTER = '''
class ScheduleBatch:
    def filter_batch(self, keep_indices):
        self.seq_lens = self.seq_lens[keep_indices]
{body}
'''
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
    assert "not applied: needs-cpu-seq-lens: " in result.output and "refused: needs_cpu_seq_lens_deferred_sum.DeferFilterBatchSum" in result.output
