"""seq-lens-host-bound (issue 67) on real releases: apply, verify and revert exactly where
requests keep their KV allocation on the host (0.5.6.post2 .. 0.5.12.post1), not applicable
where they do not (0.5.4.post3, 0.5.5) or where upstream folded the hand-over away (0.5.13+)."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot

PATCH = "seq-lens-host-bound"
SCHEDULE = "srt/managers/schedule_batch.py"
FORWARD = "srt/model_executor/forward_batch_info.py"


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [
        ("0.5.5", "not-applicable"),
        ("0.5.6.post2", "absent"),
        ("0.5.9", "absent"),
        ("0.5.10", "absent"),
        ("0.5.12.post1", "absent"),
        ("0.5.13", "not-applicable"),
        ("0.5.23", "not-applicable"),
    ],
)
def test_real_trees(linked_tree, cli, version, state):
    tree = linked_tree(version)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == state
    assert cli("apply", tree, "needs-cpu-seq-lens").exit_code in (0, 1)  # what it requires, first
    before = snapshot(tree)
    if state != "absent":
        assert cli("apply", tree, PATCH).exit_code in (0, 1) and snapshot(tree) == before
        return
    assert cli("apply", tree, PATCH).exit_code == 0
    schedule, forward = (tree / SCHEDULE).read_text(), (tree / FORWARD).read_text()
    assert "seq_lens_host_bound=seq_lens_host_bound(self.reqs, seq_lens_cpu)" in schedule
    assert schedule.count("seq_lens_host_bound: Optional[SeqLensBound] = None") == 1
    assert "seq_lens_host_bound=checked_host_bound(batch.seq_lens_host_bound, batch.seq_lens)" in forward
    assert forward.count("seq_lens_host_bound: Optional[SeqLensBound] = None") == 1
    assert cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
def test_every_eager_consumer_of_the_patched_set_hands_its_batch(linked_tree, cli):
    """With the whole set applied, each eager helper call that used to take the static bound
    alone passes the batch that carries the host bound (CUDA-graph replays keep the static one:
    they get no batch)."""
    import re

    tree = linked_tree("0.5.12.post1")
    assert cli("apply", tree).exit_code == 0
    calls = []
    for path in (tree / "srt/layers/attention").glob("*.py"):
        for match in re.finditer(
            r"(host_max_seq_len|seq_lens_sum_or_bound|prefix_lens_sum_or_bound)\(([^\n]*)", path.read_text()
        ):
            calls.append((path.name, match.group(1), match.group(2)))
    eager = [c for c in calls if "forward_batch" in c[2]]
    assert len(eager) >= 14, calls
    assert all(c[2].rstrip(") +(,").endswith("forward_batch") or "forward_batch)" in c[2] for c in eager), eager
