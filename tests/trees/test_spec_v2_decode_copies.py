"""spec-v2-decode-copies (issue 53): spec-v2 prepare_for_decode's kv-lens
copies to the device, pinned and non_blocking: snippets, fork spellings,
upstream's shape, then the real trees (every copy non_blocking from a
pinned tensor, exact revert); and the runtime's pin decision."""

from __future__ import annotations

import ast

import pytest
from support import NATIVE, PRE_UPSTREAM, patch_states, snapshot

PATCH = "spec-v2-decode-copies"
FILE = "srt/speculative/eagle_info_v2.py"
FORWARD_BATCH = "srt/model_executor/forward_batch_info.py"

PINNED = "pin_for=device"


# --- real trees --------------------------------------------------------------------------


def kv_copies(source: str) -> list[tuple[bool, bool]]:
    """(non_blocking, source pinned) of each ``*_kv_lens_cpu.to(...)`` in prepare_for_decode."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "EagleDraftInputV2Mixin")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_decode")
    pinned = {
        a.targets[0].id: any(k.arg == "pin_memory" for k in a.value.keywords)
        for a in ast.walk(fn)
        if isinstance(a, ast.Assign)
        and isinstance(a.targets[0], ast.Name)
        and isinstance(a.value, ast.Call)
        and ast.unparse(a.value.func) == "torch.tensor"
    }
    return [
        (any(k.arg == "non_blocking" and ast.unparse(k.value) == "True" for k in c.keywords), pinned[c.func.value.id])
        for c in ast.walk(fn)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr == "to"
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id.endswith("kv_lens_cpu")
    ]


@pytest.mark.trees
@pytest.mark.parametrize("version", [*PRE_UPSTREAM, "0.5.7"])
def test_release_apply_verify_idempotent_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert kv_copies((tree / FILE).read_text()) == [(False, False)] * 4
    assert PINNED not in (tree / FORWARD_BATCH).read_text()
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    assert cli("apply", tree, PATCH).exit_code == 0
    assert kv_copies((tree / FILE).read_text()) == [(True, True)] * 4
    assert (tree / FORWARD_BATCH).read_text().count(PINNED) == 5  # extend lengths, EP count, DP counts
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
    assert cli("verify", tree, PATCH).exit_code == 0
    after = snapshot(tree)
    assert cli("apply", tree, PATCH, "--check").exit_code == 0 and snapshot(tree) == after
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
def test_with_every_patch_on_the_primary_release(linked_tree, cli):
    tree = linked_tree("0.5.12.post1")
    assert cli("apply", tree).exit_code == 0
    assert kv_copies((tree / FILE).read_text()) == [(True, True)] * 4
    assert (tree / FORWARD_BATCH).read_text().count(PINNED) == 5
    assert cli("verify", tree).exit_code == 0


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state", [("0.5.19", "native"), ("0.5.23", "native"), ("0.5.4.post3", "not-applicable")]
)
def test_upstream_releases_are_left_alone(linked_tree, cli, version, state):
    tree = linked_tree(version)
    before = snapshot(tree)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == state and report["ok"]
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version, pins", [(NATIVE, 5), ("0.5.16", 5), ("0.5.18", 3)])
def test_between_upstreams_copies_and_its_pins_only_init_new_is_carried(linked_tree, cli, version, pins):
    """0.5.13 .. 0.5.18: prepare_for_decode's copies are upstream's (native),
    init_new's lists still pageable (pinned in 0.5.19): partial, and the
    apply writes forward_batch_info.py alone (0.5.18: the DP counts moved to
    init_mlp_sync_metadata, not carried)."""
    tree = linked_tree(version)
    before = snapshot(tree)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == "partial" and "ForwardBatch.init_new" in report["reason"]
    assert cli("apply", tree, PATCH).exit_code == 0
    changed = {f for f, digest in snapshot(tree).items() if before.get(f) != digest}
    assert {f for f in changed if not f.startswith("srt/_patchkit/")} == {FORWARD_BATCH}
    assert (tree / FORWARD_BATCH).read_text().count(PINNED) == pins
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied" and cli("verify", tree, PATCH).exit_code == 0
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before
