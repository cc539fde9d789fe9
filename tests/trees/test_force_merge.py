"""``revert --force`` merges by hunk: it drops only the edits that overlap a
patch's lines, keeps the others, and names what it dropped and where the
whole edited copy is (docs/reliability.md, "revert --force")."""

from __future__ import annotations

import re

import pytest
from support import PRIMARY
from support import pristine as pristine_tree

pytestmark = pytest.mark.trees

MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"
HOOK_LINE = "    def update_verify_buffers_to_fill_after_draft(\n"
OVERLAPPING = "        self.fork_counter += 1\n"
TOP = "FORK_SETTING = 3\n"
TAIL = "# fork: tuned for our cluster\n"


def test_force_drops_only_the_overlapping_edit(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, HOOK).exit_code == 0
    text = (tree / MHA).read_text()
    edited = text.replace(
        "        pass\n\n    def get_cuda_graph_seq_len_fill_value",
        f"{OVERLAPPING}\n    def get_cuda_graph_seq_len_fill_value",
    )
    edited = edited.replace("logger = logging.getLogger(__name__)\n", f"logger = logging.getLogger(__name__)\n{TOP}")
    edited += TAIL
    assert edited.count(OVERLAPPING) == 1 and TOP in edited
    (tree / MHA).write_text(edited)
    assert cli("revert", tree).exit_code == 2  # without --force the overlap stops the revert

    result = cli("revert", tree, "--force")
    assert result.exit_code == 0, result.output
    reverted = (tree / MHA).read_text()
    assert HOOK_LINE not in reverted and OVERLAPPING not in reverted
    assert TOP in reverted and reverted.endswith(TAIL), "an edit that did not overlap the patch was dropped"
    pristine = (pristine_tree(PRIMARY) / MHA).read_text()
    assert (
        reverted
        == pristine.replace("logger = logging.getLogger(__name__)\n", f"logger = logging.getLogger(__name__)\n{TOP}")
        + TAIL
    )
    line = next(m for m in result.output.splitlines() if "--force discarded" in m)
    found = re.search(
        r"\((\d+) line\(s\) of yours at line (\d+) of the reverted file\) and kept the others; "
        r"your whole copy: \.patchkit/blobs/([0-9a-f]{64})",
        line,
    )
    assert found, line
    dropped, at, blob = int(found[1]), int(found[2]), found[3]
    assert dropped == 1  # the one line of the user's in the patched method, not patchkit's lines around it
    assert "def get_cuda_graph_seq_len_fill_value" in reverted.splitlines()[at - 1]
    assert (tree / ".patchkit" / "blobs" / blob).read_text() == edited
