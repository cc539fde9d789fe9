"""min-new-tokens-no-sync (sglang #28397): the min_new_tokens penalty added with
torch.where, not boolean-mask indexing (a host sync every decode step)."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot

from patchkit.codemods import min_new_tokens_no_sync as mnt
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

PATCH = "min-new-tokens-no-sync"
FILE = "srt/sampling/penaltylib/min_new_tokens.py"

BEFORE = code("""
    import torch


    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            mask = (self.len_output_tokens < self.min_new_tokens).expand_as(logits)
            logits[mask] += self.stop_token_penalties[mask]
""")
AFTER = code("""
    import torch


    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            # Boolean-mask indexing (logits[mask]) forces a device-to-host sync every
            # decode step; torch.where is an elementwise select (sglang #28397).
            mask = self.len_output_tokens < self.min_new_tokens
            logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))
""")
UPSTREAM = code("""
    class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
        def _apply(self, logits: torch.Tensor):
            mask = self.len_output_tokens < self.min_new_tokens
            logits.add_(torch.where(mask, self.stop_token_penalties, 0.0))
""")


def test_the_masked_add_becomes_a_select():
    assert_codemod(mnt.AddPenaltyWithoutSync, BEFORE, AFTER)


def test_upstreams_shape_is_done():
    assert_state(mnt.AddPenaltyWithoutSync, UPSTREAM, State.DONE)


def test_renamed_names_and_a_mask_without_expand_as():
    """Anchored by meaning: whatever the logits and mask are called."""
    src = (
        BEFORE.replace("logits", "scores")
        .replace("mask", "on")
        .replace(
            "(self.len_output_tokens < self.min_new_tokens).expand_as(scores)",
            "self.len_output_tokens < self.min_new_tokens",
        )
    )
    out = code(
        AFTER.replace("logits.add_", "scores.add_")
        .replace("logits: torch", "scores: torch")
        .replace("mask = ", "on = ")
        .replace("torch.where(mask,", "torch.where(on,")
    )
    assert_codemod(mnt.AddPenaltyWithoutSync, src, out)


def test_a_line_between_stays_and_a_different_shape_is_missing():
    src = BEFORE.replace("        logits[mask] +=", "        self.seen = True\n        logits[mask] +=")
    out = AFTER.replace("        logits.add_(", "        self.seen = True\n        logits.add_(")
    assert_codemod(mnt.AddPenaltyWithoutSync, src, out)
    other = BEFORE.replace("logits[mask] += self.stop_token_penalties[mask]", "logits.masked_fill_(mask, -1.0)")
    finding = detect(mnt.AddPenaltyWithoutSync, other)
    assert finding.state is State.MISSING and "masked add" in finding.detail


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state", [("0.5.10", "absent"), ("0.5.13", "absent"), ("0.5.14", "native"), ("0.5.23", "native")]
)
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


# --- the penalizers' output ids (sglang #28491, #28500) --------------------------------

BATCH = code("""
    import torch


    class ScheduleBatch:
        def prepare_for_decode(self):
            if self.sampling_info.penalizer_orchestrator.is_required:
                if self.enable_overlap:
                    delayed_output_ids = torch.tensor(
                        [req.output_ids[-1] for req in self.reqs],
                        dtype=torch.int64,
                        device=self.device,
                    )
                    self.sampling_info.penalizer_orchestrator.cumulate_output_tokens(
                        delayed_output_ids
                    )
                else:
                    self.sampling_info.penalizer_orchestrator.cumulate_output_tokens(
                        self.output_ids.to(torch.int64)
                    )
""")
BATCH_AFTER = BATCH.replace(
    "import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import pin_memory_for\n"
).replace(
    "                    device=self.device,\n                )\n",
    "                    pin_memory=pin_memory_for(self.device),\n"
    "                ).to(self.device, non_blocking=True)\n",
)


def test_the_output_ids_are_built_pinned_and_copied_non_blocking():
    assert_codemod(mnt.OutputIdsCopyWithoutWait, BATCH, BATCH_AFTER)


def test_a_list_handed_straight_to_the_penalizers_and_the_spec_v2_class():
    src = code("""
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                if batch.sampling_info.penalizer_orchestrator.is_required:
                    batch.sampling_info.penalizer_orchestrator.cumulate_output_tokens(
                        torch.tensor([r.output_ids[-1] for r in batch.reqs], device=batch.device)
                    )
    """)
    assert (
        "torch.tensor([r.output_ids[-1] for r in batch.reqs], pin_memory=pin_memory_for(batch.device))"
        ".to(batch.device, non_blocking=True)"
    ) in apply(mnt.SpecV2OutputIdsCopyWithoutWait, src)


def test_upstreams_shared_method_is_done_and_no_penalizer_is_superseded():
    upstream = code("""
        class ScheduleBatch:
            def prepare_for_decode(self):
                if self.sampling_info.penalizer_orchestrator.is_required:
                    self.cumulate_penalty_output_tokens()
    """)
    assert_state(mnt.OutputIdsCopyWithoutWait, upstream, State.DONE, "0.5.14")
    none = code("""
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                bs = batch.batch_size()
    """)
    assert_state(mnt.SpecV2OutputIdsCopyWithoutWait, none, State.SUPERSEDED)


SCHEDULE = "srt/managers/schedule_batch.py"
SPEC_V2 = "srt/speculative/eagle_info_v2.py"
PINNED = "pin_memory=pin_memory_for("


@pytest.mark.trees
@pytest.mark.parametrize("version, spec_v2", [("0.5.10", False), ("0.5.12.post1", True), ("0.5.13", True)])
def test_real_trees_copy_the_output_ids_without_a_wait(make_tree, cli, version, spec_v2):
    tree = make_tree(version)
    before = snapshot(tree)
    assert PINNED not in (tree / SCHEDULE).read_text()
    assert cli("apply", tree, PATCH).exit_code == 0
    assert (tree / SCHEDULE).read_text().count(PINNED) == 1
    assert ((tree / SPEC_V2).read_text().count(PINNED) == 1) is spec_v2
    checks = {c["codemod"].split(".")[1]: c["state"] for c in patch_states(cli, tree, PATCH)[PATCH]["checks"]}
    assert checks["OutputIdsCopyWithoutWait"] == "done"
    assert checks["SpecV2OutputIdsCopyWithoutWait"] == ("done" if spec_v2 else "superseded")
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
