"""triton-spec-v2-verify (issue 53; upstream 0.5.17's VerifyMask.fits):
Triton's capture-time verify mask gets C + D cells a token and records the
max_bs it holds, so the spec-v2 workers' guard hands it only to a batch it
fits. Snippets, then the real trees, then the guard on the patched sizes."""

from __future__ import annotations

import pytest
from support import PRE_UPSTREAM, patch_states, snapshot

PATCH = "triton-spec-v2-verify"
TRITON = "srt/layers/attention/triton_backend.py"
WORKER = "srt/speculative/eagle_worker_v2.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", [*PRE_UPSTREAM, "0.5.9"])
def test_release_apply_verify_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    assert cli("apply", tree, PATCH).exit_code == 0
    triton = (tree / TRITON).read_text()
    assert "(max_num_tokens * (self.max_context_len + (self.num_draft_tokens or 0)))" in triton
    assert triton.count("self.verify_tree_mask_max_bs = max_bs\n") == 1
    assert "verify_tree_mask_for_batch(" in (tree / WORKER).read_text()
    assert " kv_indptr[-1], dtype" not in triton and "seq_lens_sum_or_bound(forward_batch.seq_lens_sum, bs," in triton
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == before


# --- the eager target verify's kv_indices (0.5.13's form) -------------------------------


@pytest.mark.trees
def test_0_5_13_gets_the_mask_bound_only(linked_tree, cli):
    """0.5.13 sizes the verify kv_indices from the host itself; its mask is pristine's."""
    tree = linked_tree("0.5.13")
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    before = (tree / TRITON).read_text()
    assert cli("apply", tree, PATCH).exit_code == 0
    triton = (tree / TRITON).read_text()
    assert "self.verify_tree_mask_max_bs = max_bs\n" in triton and "seq_lens_sum_or_bound" not in triton
    assert " kv_indptr[-1], dtype" not in before  # upstream's own host size, left as it is
    assert triton.count("seq_lens_sum = bs * self.max_context_len") == before.count(
        "seq_lens_sum = bs * self.max_context_len"
    )
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
