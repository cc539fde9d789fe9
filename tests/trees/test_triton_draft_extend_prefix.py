"""triton-draft-extend-prefix (sglang #26651) on the real releases: applied on
0.5.8 .. 0.5.12.post1 (apply, verify, a second apply changes nothing, revert
byte-exact), not applicable on 0.5.4 .. 0.5.7 (the branch serves V1 only, said
in one line), native on 0.5.13+ (upstream's _update_draft_extend_buffers)."""

from __future__ import annotations

import pytest
from support import class_section, patch_states, snapshot, verified_idempotent_reverted

PATCH = "triton-draft-extend-prefix"
TRITON = "srt/layers/attention/triton_backend.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.8", "0.5.12.post1"])
def test_applied_verified_and_reverted_exactly(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / TRITON).read_text()
    compile(text, TRITON, "exec")
    backend = class_section(text, "TritonAttnBackend")
    replay = backend[backend.index("def init_forward_metadata_replay_cuda_graph") :]
    replay = replay[: replay.index("\n    def ", 1)]
    branch = replay[replay.index("is_draft_extend(include_v2=True)") :]
    # the prefix, then the indptr and the page-table gather from it; the capture is left as it was
    assert branch.index("spec_info.extend_seq_lens_tensor[:bs], min=0") < branch.index(
        "torch.cumsum(draft_extend_prefix_lens, dim=0)"
    )
    assert "                draft_extend_prefix_lens,\n                kv_indptr," in branch
    capture = backend[backend.index("def init_forward_metadata_capture_cuda_graph") :]
    assert "draft_extend_prefix_lens" not in capture[: capture.index("\n    def ", 1)]
    verified_idempotent_reverted(cli, tree, PATCH, before)


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [("0.5.4.post3", "not-applicable"), ("0.5.7", "not-applicable"), ("0.5.13", "native"), ("0.5.23", "native")],
)
def test_other_releases(make_tree, cli, version, state):
    tree = make_tree(version)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == state
    if state == "not-applicable":
        assert "serves V1 only" in report["reason"]
