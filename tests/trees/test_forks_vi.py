"""Vendor forks VI (issue 69): the fork shapes that regressed or broke, each a
synthetic fork (small edits written here on a real release tree).

- regressions: ``ForwardBatch.init_new`` copying the extend lengths through
  its own pinned memory (shape 1: 0.5.7 and 0.5.12.post1 forks) or through
  locals (a 0.5.10 ROCm fork); ``maybe_wait_verify_done`` with the event in a
  local, an early return and the host wait in a branch (0.5.11);
- the tree-mask build moved into a decorator of ``EagleDraftWorker`` (0.5.12);
- FlashMLA's forward_extend handing DRAFT_EXTEND_V2 to its parent in one tuple
  test, and FlashMLA code no codemod fits (refused alone);
- the postcondition of needs-cpu-seq-lens: a fork's host-only use of the
  extend lengths no guard fits is refused at its line, and the advice the
  refusal prints, run exactly as printed, applies the rest.
"""

from __future__ import annotations

import re
import shlex

import pytest
from fork_shapes import BRANCHED_WAIT, FORWARD_BATCH, LOCALS, OWN_PINS, RELEASE_COPIES, draft_in_a_wrapper
from support import NOT_ON_PRIMARY, PRIMARY, carries_every_patch, edit_file, patch_states, snapshot

pytestmark = pytest.mark.trees

DECISION = "needs-cpu-seq-lens"
COPIES = "spec-v2-decode-copies"
SCHEDULE_BATCH = "srt/managers/schedule_batch.py"
WORKER = "srt/speculative/eagle_worker_v2.py"


def test_a_fork_that_pins_its_own_extend_copies_carries_every_patch(make_tree, cli):
    """Shape 1 (0.5.12.post1, both lists): spec-v2-decode-copies finds the fork's pins
    (its own change), and needs-cpu-seq-lens builds them with pinned_tensor, which pins a
    host list as the fork did and keeps the GPU-only draft extend's device lengths there."""
    tree = make_tree(PRIMARY)
    edit_file(tree, FORWARD_BATCH, RELEASE_COPIES, OWN_PINS)
    output = carries_every_patch(cli, tree)
    assert "replaces the vendor's" in output and "pin_memory" in output  # said, one note line
    assert cli("apply", tree).exit_code == 0
    text = (tree / FORWARD_BATCH).read_text()
    assert ".pin_memory()" not in text
    assert text.count("pinned_tensor(batch.extend_seq_lens, dtype=torch.int32, pin_for=device)") == 1


def test_a_0_5_7_fork_that_pins_its_prefix_lengths_carries_both_patches(make_tree, cli):
    """Shape 1 as seen on 0.5.7: the prefix lengths pinned by the fork, the others not."""
    tree = make_tree("0.5.7")
    edit_file(
        tree,
        FORWARD_BATCH,
        RELEASE_COPIES,
        RELEASE_COPIES.split("            ret.extend_prefix_lens")[0]
        + OWN_PINS[OWN_PINS.index("            ret.extend_prefix_lens") :],
    )
    forked = snapshot(tree)
    applied = cli("apply", tree)
    assert f"not applied: {DECISION}" not in applied.output and f"not applied: {COPIES}" not in applied.output
    states = patch_states(cli, tree, DECISION, COPIES)
    assert {p: s["state"] for p, s in states.items()} == {DECISION: "applied", COPIES: "applied"}
    text = (tree / FORWARD_BATCH).read_text()
    assert ".pin_memory()" not in text and text.count("pin_for=device") >= 2
    assert cli("revert", tree).exit_code == 0 and snapshot(tree) == forked


def test_a_fork_that_builds_its_host_tensors_in_locals_carries_every_patch(make_tree, cli):
    tree = make_tree("0.5.10")
    edit_file(tree, FORWARD_BATCH, RELEASE_COPIES, LOCALS)
    carries_every_patch(cli, tree)
    assert cli("apply", tree).exit_code == 0
    text = (tree / FORWARD_BATCH).read_text()
    assert "_seq_cpu = pinned_tensor(batch.extend_seq_lens, dtype=torch.int32, pin_for=device)" in text


def test_a_fork_whose_host_wait_is_in_a_branch_carries_every_patch(make_tree, cli):
    tree = make_tree("0.5.11")
    text = (tree / SCHEDULE_BATCH).read_text()
    method = re.search(r"    def maybe_wait_verify_done\(self\):\n(?:        .*\n|\n)+", text)
    assert method is not None
    body = "    def maybe_wait_verify_done(self):\n        draft_input = self.spec_info\n" + BRANCHED_WAIT + "\n"
    edit_file(tree, SCHEDULE_BATCH, method.group(0), body)
    carries_every_patch(cli, tree)
    assert cli("apply", tree).exit_code == 0
    assert "wait_event_on_stream(verify_done)" in (tree / SCHEDULE_BATCH).read_text()


# -- the postcondition, and advice that works the first time ---------------------------------

NUMPY_POSITIONS = LOCALS.replace(
    "torch.as_strided(_prefix_cpu, _prefix_cpu.shape, (1,))", "np.cumsum(_prefix_cpu.numpy())"
)


def test_a_host_only_use_of_the_lengths_is_refused_at_its_line_and_the_advice_applies_the_rest(make_tree, cli):
    tree = make_tree(PRIMARY)
    edit_file(tree, FORWARD_BATCH, RELEASE_COPIES, NUMPY_POSITIONS)
    result = cli("apply", tree)
    assert result.exit_code == 1, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.startswith(f"not applied: {DECISION}: ")]
    on_disk = next(
        i for i, t in enumerate((tree / FORWARD_BATCH).read_text().splitlines(), 1) if "_prefix_cpu.numpy()" in t
    )
    assert f"refused: {FORWARD_BATCH}:{on_disk}: ForwardBatch.init_new hands `_prefix_cpu` to `.numpy()`" in line
    # One word for one state: what apply did not apply, status and verify call absent (not partial,
    # though patches applied beside them wrote codemods they share).
    states = patch_states(cli, tree)
    not_applied = {ln.split(":")[1].strip() for ln in result.output.splitlines() if ln.startswith("not applied: ")}
    assert {states[p]["state"] for p in not_applied} == {"absent"}, {p: states[p]["state"] for p in not_applied}
    verdict = cli("verify", tree).output.splitlines()[-1]
    assert verdict.startswith("verify: FAILED (") and "partial" not in verdict
    assert all(f"{p}: absent" in verdict for p in not_applied), verdict
    # The advice, as printed: one command, every dependent left out at once.
    advice = re.search(r"or `(--skip [^`]+)` \(which also leaves out ([^)]+), as they require it", line)
    assert advice is not None, line
    assert cli("revert", tree).exit_code == 0
    # --skip alone names every patch that needs it, at once, and the command that works.
    alone = cli("apply", tree, "--skip", DECISION)
    assert alone.exit_code == 2 and len(alone.output.strip().splitlines()) == 1, alone.output
    assert f"`--skip {DECISION} --cascade` leaves them out too" in alone.output
    assert all(d in alone.output for d in re.split(r", | and ", advice.group(2)))
    again = cli("apply", tree, *shlex.split(advice.group(1)))
    assert again.exit_code == 0, again.output
    left_out = {DECISION, *re.split(r", | and ", advice.group(2))}
    states = patch_states(cli, tree)
    assert {p for p, s in states.items() if s["state"] != "applied"} - NOT_ON_PRIMARY == left_out


# -- 3. FlashMLA: its refusal costs FlashMLA's part alone ------------------------------------

FLASHMLA = "srt/layers/attention/flashmla_backend.py"
TWO_TESTS = """        if (
            forward_batch.forward_mode == ForwardMode.EXTEND
            or forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND
        ):
"""
ONE_TUPLE = """        if forward_batch.forward_mode in (
            ForwardMode.EXTEND,
            ForwardMode.DRAFT_EXTEND,
            ForwardMode.DRAFT_EXTEND_V2,
        ):
"""
FIXED_Q_LENS = """                    cache_seqlens=forward_batch.seq_lens.to(torch.int32)
                    + self.num_draft_tokens,
"""


def test_a_flashmla_fork_handing_the_v2_draft_extend_to_its_parent_in_one_tuple_carries_every_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    edit_file(tree, FLASHMLA, TWO_TESTS, ONE_TUPLE)
    output = carries_every_patch(cli, tree)
    assert "ForwardMode.DRAFT_EXTEND_V2" in output and "no longer goes to the parent" in output


def test_flashmla_code_no_codemod_fits_refuses_flashmla_alone(make_tree, cli):
    """FlashMLA keeps the mirror (it does not opt out: the decision keeps the mirror while it
    is in use); FA3, Triton and the TRT-LLM backends get theirs."""
    tree = make_tree(PRIMARY)
    edit_file(tree, FLASHMLA, TWO_TESTS, ONE_TUPLE)
    text = (tree / FLASHMLA).read_text()
    assert text.count(FIXED_Q_LENS) == 2
    (tree / FLASHMLA).write_text(
        text.replace(FIXED_Q_LENS, "                    cache_seqlens=acme_fixed_q_lens(forward_batch),\n")
    )
    result = cli("apply", tree)
    assert result.exit_code == 1
    refused = [ln for ln in result.output.splitlines() if ln.startswith("not applied: ")]
    assert len(refused) == 1 and refused[0].startswith(f"not applied: flashmla-spec-v2: refused: {FLASHMLA}:")
    assert refused[0].endswith("`--skip flashmla-spec-v2` (the other patches still apply)")
    states = patch_states(cli, tree)
    assert {p for p, s in states.items() if s["state"] != "applied"} - NOT_ON_PRIMARY == {"flashmla-spec-v2"}
    assert states["flashmla-spec-v2"]["state"] == "not-applicable"
    assert "needs_cpu_seq_lens" not in (tree / FLASHMLA).read_text()  # FlashMLA keeps the mirror
    assert cli("verify", tree).output.splitlines()[-1] == "verify: FAILED (flashmla-spec-v2: not-applicable)"


# -- 2. the tree-mask read one decorator away --------------------------------------------------


def test_a_fork_that_builds_the_tree_mask_in_a_decorator_carries_every_patch(make_tree, cli):
    """A 0.5.12 fork: ``@draft_wrapper``, a static method of EagleDraftWorker, builds the tree
    mask after ``draft``; the read of the mirror there is guarded where it is."""
    tree = make_tree(PRIMARY)
    path = tree / WORKER
    path.write_text(draft_in_a_wrapper(path.read_text()))
    carries_every_patch(cli, tree)
    assert cli("apply", tree).exit_code == 0
    text = path.read_text()
    wrapper = text[text.index("    def draft_wrapper(") : text.index("    @draft_wrapper\n")]
    assert "tree_mask_seq_lens_sum(model_worker_batch.seq_lens_sum, tree_mask_buf," in wrapper
