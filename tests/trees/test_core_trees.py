"""The core contract on real trees, with the trtllm-mha-overlap-hook patch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import ALL_NATIVE, NATIVE, PRIMARY, pristine, snapshot

from patchkit import registry
from patchkit.tree import find_tree

pytestmark = pytest.mark.trees

MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"


def state_of(cli, tree, pid):
    result = cli("status", tree, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}[pid]["state"]


def test_apply_verify_idempotent_revert_on_primary(make_tree, cli):
    tree = make_tree(PRIMARY)
    before = snapshot(tree)
    assert state_of(cli, tree, HOOK) == "absent"
    assert cli("verify", tree).exit_code == 1

    result = cli("apply", tree, HOOK)
    assert result.exit_code == 0, result.output
    after = snapshot(tree)
    assert {k for k in before if before[k] != after[k]} == {MHA}
    compile((tree / MHA).read_bytes(), MHA, "exec")
    assert "def update_verify_buffers_to_fill_after_draft" in (tree / MHA).read_text()
    assert state_of(cli, tree, HOOK) == "applied"
    assert cli("verify", tree, HOOK).exit_code == 0

    again = cli("apply", tree, HOOK)
    assert again.exit_code == 0
    assert snapshot(tree) == after

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before
    assert state_of(cli, tree, HOOK) == "absent"


def test_dry_run_prints_a_diffstat_and_writes_nothing(make_tree, cli):
    tree = make_tree(PRIMARY)
    before = snapshot(tree)
    result = cli("apply", tree, HOOK, "--dry-run")
    assert result.exit_code == 0
    assert f" python/sglang/{MHA} |" in result.output and "+++ b/" not in result.output
    with_diff = cli("apply", tree, HOOK, "--dry-run", "--diff")
    assert f"+++ b/python/sglang/{MHA}" in with_diff.output
    assert "+    def update_verify_buffers_to_fill_after_draft(" in with_diff.output
    assert snapshot(tree) == before
    assert not (tree / ".patchkit").exists()


def test_check_exits_1_when_changes_needed(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, HOOK, "--check").exit_code == 1
    cli("apply", tree, HOOK)
    assert cli("apply", tree, HOOK, "--check").exit_code == 0


@pytest.mark.parametrize("version", [NATIVE, ALL_NATIVE])
def test_native_release_is_detected_and_untouched(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert state_of(cli, tree, HOOK) == "native"
    result = cli("apply", tree, HOOK)
    assert result.exit_code == 0
    assert snapshot(tree) == before
    # Every patch is upstream from ALL_NATIVE on (0.5.13 still lacks fa3-spec-v2) but
    # dsa-no-mirror, which goes past upstream there (sglang #33973): verify once it is applied.
    assert cli("verify", tree).exit_code == 1
    if version == ALL_NATIVE:
        assert cli("apply", tree, "dsa-no-mirror").exit_code == 0
        assert cli("verify", tree).exit_code == 0


@pytest.mark.parametrize("layout", ["package", "python", "checkout"])
def test_every_layout(make_tree, cli, layout):
    given = make_tree(PRIMARY, layout)
    info = find_tree(given)
    assert info.layout == layout and info.version == PRIMARY
    assert cli("apply", given, HOOK).exit_code == 0
    assert state_of(cli, given, HOOK) == "applied"
    assert cli("revert", given).exit_code == 0
    assert snapshot(info.package) == snapshot(pristine(PRIMARY))


def test_status_on_pristine_tree_leaves_no_trace(make_tree, cli):
    tree = make_tree(PRIMARY)
    cli("status", tree)
    cli("verify", tree)
    assert not (tree / ".patchkit").exists()


def test_patch_definitions_load_from_an_uninstalled_checkout():
    """``python -m patchkit`` in a checkout that was never pip-installed (as
    ``scripts/gpu_e2e.py bundle`` runs it) finds the repo's ``patches/``: no
    site-packages, so no ``patchkit.patches`` package mapped by an install."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from patchkit import registry; "
        "print(' '.join(p.id for p in registry.all_patches()))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code, str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [p.id for p in registry.all_patches()]
