"""Snippet tests of tests/trees/test_verify_wait_on_stream.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest
from fork_shapes import BRANCHED_WAIT

from patchkit.codemods import verify_wait_on_stream as vw
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect

FILE = "srt/managers/schedule_batch.py"


BEFORE = code("""
    import torch


    class ScheduleBatch:
        def maybe_wait_verify_done(self):
            if self.is_spec_v2:
                draft_input: EagleDraftInput = self.spec_info
                if draft_input.verify_done is not None:
                    draft_input.verify_done.synchronize()
""")


AFTER = code("""
    import torch
    from sglang.srt._patchkit.runtime import wait_event_on_stream


    class ScheduleBatch:
        def maybe_wait_verify_done(self):
            if self.is_spec_v2:
                draft_input: EagleDraftInput = self.spec_info
                if draft_input.verify_done is not None:
                    # patchkit (sglang #25879): the schedule stream waits for the verify, not the
                    # host, which goes on preparing the next step (a host wait on ROCm, as upstream).
                    wait_event_on_stream(draft_input.verify_done)
""")


def test_the_host_wait_moves_onto_the_stream():
    assert_codemod(vw.VerifyWaitOnStream, BEFORE, AFTER)


def test_a_fork_that_names_its_input_otherwise_and_keeps_a_comment():
    src = BEFORE.replace("draft_input", "spec").replace(
        "                    spec.verify_done", "                    # ours\n                    spec.verify_done"
    )
    out = AFTER.replace("draft_input", "spec").replace(
        "                    # patchkit", "                    # ours\n                    # patchkit"
    )
    assert_codemod(vw.VerifyWaitOnStream, src, out)


@pytest.mark.parametrize(
    "line",
    ["draft_input.verify_done.wait()", "torch.cuda.current_stream().wait_event(draft_input.verify_done)"],
)
def test_a_forks_own_stream_wait_is_superseded_naming_its_line(line):
    src = BEFORE.replace("draft_input.verify_done.synchronize()", line)
    finding = assert_state(vw.VerifyWaitOnStream, src, State.SUPERSEDED, "waits for the previous verify on the stream")
    assert finding.by_tree and line in finding.detail


# A fork between 0.5.11 and 0.5.12 (issue 69): the event in a local, an early return, and the
# host wait in the else branch of its own stream wait behind a flag (off by default).
BRANCHED = (
    code("""
    import torch


    class ScheduleBatch:
        def maybe_wait_verify_done(self):
            draft_input = self.spec_info
""")
    + BRANCHED_WAIT
)


def test_a_forks_host_wait_in_a_branch_of_its_own_stream_wait_moves_onto_the_stream():
    """The flag's path already waits on the stream; the default path's host wait is carried."""
    after = BRANCHED.replace(
        "import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import wait_event_on_stream\n"
    ).replace(
        "            verify_done.synchronize()",
        "            # patchkit (sglang #25879): the schedule stream waits for the verify, not the\n"
        "            # host, which goes on preparing the next step (a host wait on ROCm, as upstream).\n"
        "            wait_event_on_stream(verify_done)",
    )
    assert_codemod(vw.VerifyWaitOnStream, BRANCHED, after)
    own = BRANCHED.replace("verify_done.synchronize()", "verify_done.wait()")
    assert_state(vw.VerifyWaitOnStream, own, State.SUPERSEDED, "waits for the previous verify on the stream")


def test_no_wait_at_all_is_a_missing_anchor_that_says_what_it_needs():
    src = BEFORE.replace("draft_input.verify_done.synchronize()", "pass")
    finding = detect(vw.VerifyWaitOnStream, src, FILE)
    assert finding.state is State.MISSING
    assert f"{FILE}:5" in finding.detail and "the host wait on verify_done" in finding.detail


def test_upstreams_tree_without_the_method_is_superseded_and_its_future_map_done():
    upstream = code("""
        class ScheduleBatch:
            def filter_batch(self):
                pass
    """)
    assert_state(vw.VerifyWaitOnStream, upstream, State.SUPERSEDED, "#25879")
    future_map = code("""
        class FutureMap:
            def resolve_seq_lens_cpu(self, batch):
                if self.publish_ready is not None:
                    self.publish_ready.wait()
    """)
    assert_state(vw.FutureMapWaitsOnStream, future_map, State.DONE)
    assert_state(vw.FutureMapWaitsOnStream, future_map.replace(".wait()", ".synchronize()"), State.SUPERSEDED)
    assert_state(vw.FutureMapWaitsOnStream, "x = 1\n", State.SUPERSEDED)  # a fork without FutureMap
