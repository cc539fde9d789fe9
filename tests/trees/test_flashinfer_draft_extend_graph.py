"""flashinfer-draft-extend-graph on the real releases: applied on 0.5.10, 0.5.11 and
0.5.12.post1 (and the inline gate of 0.5.8, 0.5.9): apply, verify, a second apply changes
nothing, revert byte-exact; native on 0.5.14+; not applicable, with its one-line
reason, on 0.5.13.x and on 0.5.4 .. 0.5.7."""

from __future__ import annotations

import pytest
from support import class_section, patch_states, snapshot, verified_idempotent_reverted

PATCH = "flashinfer-draft-extend-graph"
BASE = "flashinfer-host-indptr"  # what it requires (the replay's host plan rides on it)
MHA = "srt/layers/attention/flashinfer_backend.py"
WORKER = "srt/speculative/eagle_worker_v2.py"
RUNTIME = "srt/_patchkit/backends/flashinfer_draft_extend_graph.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1", "0.5.9", "0.5.8"])
def test_applied_verified_idempotent_and_reverted_exactly(make_tree, cli, version):
    tree = make_tree(version)
    pristine = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    assert cli("apply", tree, BASE).exit_code == 0
    before = snapshot(tree)  # with what it requires
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MHA).read_text()
    compile(text, MHA, "exec")
    backend = class_section(text, "FlashInferAttnBackend")
    assert backend.count("if forward_mode.is_draft_extend_v2():") == 2
    assert "self.forward_metadata = capture_draft_extend_v2(" in backend
    assert "BatchPrefillWithPagedKVCacheWrapper, PrefillMetadata," in backend
    assert "replay_draft_extend_v2(\n" in backend
    worker = (tree / WORKER).read_text()
    compile(worker, WORKER, "exec")
    assert "backends.flashinfer_draft_extend_graph import admits_flashinfer_draft_extend\n" in worker
    assert worker.count("admits_flashinfer_draft_extend(") == 1  # one admission, behind the switch
    assert "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1" in worker
    assert (tree / RUNTIME).exists()
    verified_idempotent_reverted(cli, tree, PATCH, before)
    assert cli("revert", tree, BASE).exit_code == 0 and snapshot(tree) == pristine


@pytest.mark.trees
def test_applying_it_alone_pulls_in_the_host_plans_and_reverts_with_them(make_tree, cli):
    tree = make_tree("0.5.12.post1")
    before = snapshot(tree)
    assert cli("apply", tree, PATCH).exit_code == 0
    states = patch_states(cli, tree, PATCH, BASE)
    assert states[PATCH]["state"] == states[BASE]["state"] == "applied"
    refused = cli("revert", tree, BASE)
    assert refused.exit_code != 0 and PATCH in refused.output  # it requires the host plans
    assert cli("revert", tree, PATCH, BASE).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.14", "0.5.17", "0.5.23"])
def test_upstream_has_it_natively(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, says",
    [
        ("0.5.13", "not carried onto 0.5.13.x"),
        ("0.5.13.post1", "not carried onto 0.5.13.x"),
        ("0.5.7", "captured on NPU only"),
        ("0.5.4.post3", "never replays its draft-extend CUDA graph"),
    ],
)
def test_not_applicable_elsewhere_with_why(make_tree, cli, version, says):
    report = patch_states(cli, make_tree(version), PATCH)[PATCH]
    assert report["state"] == "not-applicable" and says in report["reason"]
