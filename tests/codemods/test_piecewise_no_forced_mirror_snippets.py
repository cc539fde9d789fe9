"""Snippet tests of tests/trees/test_piecewise_no_forced_mirror.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import piecewise_no_forced_mirror as pw
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

DECIDE = """
def decide_needs_cpu_seq_lens(server_args, attn_backends):
    if server_args.enable_two_batch_overlap:
        return True
    if not server_args.disable_piecewise_cuda_graph:
        # FIXME: support PCG without seq lens cpu value
        return True
    return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)
"""


def test_sglangs_own_rule_is_replaced_by_the_ngram_rule():
    out = apply(pw.DropPiecewiseRule, DECIDE)
    assert "disable_piecewise_cuda_graph" not in out and "FIXME: support PCG" not in out
    assert "    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm\n" in out
    assert (
        "    if SpeculativeAlgorithm.from_string(server_args.speculative_algorithm).is_ngram():\n        return True\n"
        in out
    )
    assert detect(pw.DropPiecewiseRule, out).state is State.DONE


def test_a_decision_without_the_rule_is_done_and_none_is_superseded():
    without = DECIDE.replace(
        "    if not server_args.disable_piecewise_cuda_graph:\n        # FIXME: support PCG without seq lens cpu value\n        return True\n",
        "",
    )
    assert detect(pw.DropPiecewiseRule, without).state is State.DONE
    assert detect(pw.DropPiecewiseRule, "class FutureMap:\n    pass\n").state is State.SUPERSEDED


INIT_OVERLAP = """
class Scheduler:
    def init_overlap(self):
        configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)
        self.future_map = FutureMap()
"""


def test_patchkits_decision_stops_forcing_the_mirror():
    out = apply(pw.ConfigureWithoutPiecewiseRule, INIT_OVERLAP)
    assert (
        "configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker, piecewise_reads_mirror=False)"
        in out
    )
    assert detect(pw.ConfigureWithoutPiecewiseRule, out).state is State.DONE


def test_the_scheduler_part_waits_for_needs_cpu_seq_lens_and_leaves_sglangs_own_decision():
    bare = INIT_OVERLAP.replace(
        "        configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)\n", ""
    )
    assert detect(pw.ConfigureWithoutPiecewiseRule, bare).state is State.TODO
    native = INIT_OVERLAP.replace(
        "configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)",
        "needs = decide_needs_cpu_seq_lens(self.server_args, backends)",
    )
    assert detect(pw.ConfigureWithoutPiecewiseRule, native).state is State.SUPERSEDED


RUNNER = """
class PiecewiseCudaGraphRunner:
    def capture_one(self, num_tokens):
        return ForwardBatch(seq_lens_cpu=torch.tensor([num_tokens]), seq_lens_sum=num_tokens)

    def replay_prepare(self, forward_batch):
        self.seq_lens_cpu = None
        return ForwardBatch(seq_lens_cpu=forward_batch.seq_lens_cpu, seq_lens_sum=forward_batch.seq_lens_sum)
"""


def test_a_runner_that_hands_the_mirror_through_is_fine():
    finding = detect(pw.PiecewiseRunnerHandsMirrorThrough, RUNNER)
    assert finding.state is State.SUPERSEDED


def test_a_runner_that_reads_the_mirror_refuses_the_patch_saying_where():
    fork = RUNNER.replace(
        "        self.seq_lens_cpu = None\n", "        bound = int(forward_batch.seq_lens_cpu.max())\n"
    )
    finding = detect(pw.PiecewiseRunnerHandsMirrorThrough, fork)
    assert finding.state is State.MISSING and finding.line == 6  # the read (the snippet starts at "class")
    assert (
        "reads `forward_batch.seq_lens_cpu`" in finding.detail
        and "stays on under piecewise CUDA graph" in finding.detail
    )
