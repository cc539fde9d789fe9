"""min-new-tokens-no-sync (sglang #28397): the min_new_tokens penalty added with
torch.where, not boolean-mask indexing (a host sync every decode step)."""

from __future__ import annotations

import pytest

from codemod_testing import assert_codemod, assert_state, code, detect
from support import patch_states, snapshot
from patchkit.codemods import min_new_tokens_no_sync as mnt
from patchkit.codemods.common.base import State

PATCH = "min-new-tokens-no-sync"
FILE = "srt/sampling/penaltylib/min_new_tokens.py"

BEFORE = code('''
    import torch


    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            mask = (self.len_output_tokens < self.min_new_tokens).expand_as(logits)
            logits[mask] += self.stop_token_penalties[mask]
''')
AFTER = code('''
    import torch


    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            # Boolean-mask indexing (logits[mask]) forces a device-to-host sync every
            # decode step; torch.where is an elementwise select (sglang #28397).
            mask = self.len_output_tokens < self.min_new_tokens
            logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))
''')
UPSTREAM = code('''
    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            mask = self.len_output_tokens < self.min_new_tokens
            logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))
''')


def test_the_masked_add_becomes_a_select():
    assert_codemod(mnt.AddPenaltyWithoutSync, BEFORE, AFTER)


def test_upstreams_shape_is_done():
    assert_state(mnt.AddPenaltyWithoutSync, UPSTREAM, State.DONE)


def test_renamed_names_and_a_mask_without_expand_as():
    """Anchored by meaning: whatever the logits and mask are called."""
    src = BEFORE.replace("logits", "scores").replace("mask", "on").replace(
        "(self.len_output_tokens < self.min_new_tokens).expand_as(scores)", "self.len_output_tokens < self.min_new_tokens")
    out = code(AFTER.replace("logits.add_", "scores.add_").replace("logits: torch", "scores: torch").replace(
        "mask = ", "on = ").replace("torch.where(mask,", "torch.where(on,"))
    assert_codemod(mnt.AddPenaltyWithoutSync, src, out)


def test_a_line_between_stays_and_a_different_shape_is_missing():
    src = BEFORE.replace("        logits[mask] +=", "        self.seen = True\n        logits[mask] +=")
    out = AFTER.replace("        logits.add_(", "        self.seen = True\n        logits.add_(")
    assert_codemod(mnt.AddPenaltyWithoutSync, src, out)
    other = BEFORE.replace("logits[mask] += self.stop_token_penalties[mask]", "logits.masked_fill_(mask, -1.0)")
    finding = detect(mnt.AddPenaltyWithoutSync, other)
    assert finding.state is State.MISSING and "masked add" in finding.detail


@pytest.mark.trees
@pytest.mark.parametrize("version, state", [("0.5.10", "absent"), ("0.5.13", "absent"), ("0.5.14", "native"), ("0.5.23", "native")])
def test_real_trees(make_tree, cli, version, state):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    if state == "native":
        return
    assert cli("apply", tree, PATCH).exit_code == 0
    assert "logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))" in (tree / FILE).read_text()
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
