"""Snippet tests of tests/trees/test_min_new_tokens_no_sync.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import min_new_tokens_no_sync as mnt
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

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
