"""A vendor's own version of the change is superseded, not a conflict (issue
45 §3): a fork whose filter_batch already drops the mirror for spec v2 and
refreshes seq_lens_sum from the requests (no device sync) gets one note naming
its line, and needs-cpu-seq-lens applies; a codemod that would remove vendor
code still refuses."""

from __future__ import annotations

import pytest
from support import PRIMARY, patch_states
from test_vendor_superseded_snippets import VENDOR

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
