"""Every patch applies, verifies and reverts exactly on drifted forks of the
primary release; a really missing anchor is reported, the rest still applies."""

from __future__ import annotations

import pytest
from drift import DRIFTS, drift
from support import NOT_ON_PRIMARY, PRIMARY, carried_states, patch_states, snapshot

from patchkit import registry

pytestmark = pytest.mark.trees

pytest.importorskip("black")


def targets() -> list[str]:
    return sorted({f for p in registry.all_patches() for f in p.files})


@pytest.mark.parametrize("name", sorted(DRIFTS))
def test_patches_survive_drift(linked_tree, cli, name):
    tree = linked_tree(PRIMARY)  # drift() breaks the links of the files it edits
    drift(tree, targets(), name)
    for rel in targets():
        if (tree / rel).exists():
            compile((tree / rel).read_bytes(), rel, "exec")
    drifted = snapshot(tree)
    assert {pid for pid, p in patch_states(cli, tree).items() if p["state"] != "absent"} == NOT_ON_PRIMARY

    applied = cli("apply", tree)
    assert applied.exit_code == 0, applied.output
    assert carried_states({k: p["state"] for k, p in patch_states(cli, tree).items()}) == {"applied"}
    assert cli("verify", tree).exit_code == 0
    patched = snapshot(tree)
    assert cli("apply", tree).exit_code == 0
    assert snapshot(tree) == patched

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == drifted


def test_missing_anchor_is_reported_and_the_rest_applies(make_tree, cli):
    tree = make_tree(PRIMARY)
    rel = "srt/layers/attention/trtllm_mha_backend.py"
    path = tree / rel
    path.write_text(path.read_text().replace("class TRTLLMHAAttnBackend(", "class VendorMHABackend("))
    result = cli("apply", tree)
    assert result.exit_code == 1
    assert f"not applied: trtllm-mha-overlap-hook: refused: {rel}: TRTLLMHAAttnBackend" in result.output
    assert (
        "`--skip trtllm-mha-overlap-hook --cascade` (which also leaves out trtllm-mha-draft-extend-v2, "
        "as they require it; the others still apply)"
    ) in result.output
    report = patch_states(cli, tree)
    assert report["trtllm-mha-overlap-hook"]["state"] == "not-applicable"
    assert rel in report["trtllm-mha-overlap-hook"]["reason"]
    others = [
        p.id
        for p in registry.all_patches()
        if rel not in p.files and "trtllm-mha-overlap-hook" not in p.requires and p.id not in NOT_ON_PRIMARY
    ]
    for pid in others:
        assert report[pid]["state"] == "applied", (pid, report[pid])
