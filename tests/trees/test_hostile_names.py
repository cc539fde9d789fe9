"""Names and places a hostile tree can choose (issue 68, item 11): a module
name that prints a GitHub workflow command, an export into patchkit's own
runtime folder, a patched tree nested in the tree an audit reads
(docs/reliability.md, "Links, FIFOs and devices")."""

from __future__ import annotations

import json

import pytest
from support import PRIMARY, linked_copy

pytestmark = pytest.mark.trees

READ = "def f(batch):\n    return batch.seq_lens_cpu.sum()\n"


def test_a_module_name_prints_no_workflow_command(linked_tree, cli):
    """`x\\n::error ...` in a module's name was printed as it is: a line that
    GitHub Actions runs as a workflow command. Paths are quoted as git quotes
    them where they hold a control character."""
    tree = linked_tree(PRIMARY)
    name = "x\n::error title=injected::boom.py"
    (tree / "srt" / name).write_text(READ)
    result = cli("audit", "-v", tree)
    assert result.exit_code == 0, result.output
    assert not [line for line in result.output.splitlines() if line.startswith("::")], result.output
    assert '"' + str(tree / "srt" / "x\\n::error title=injected::boom.py") + '"' in result.output
    assert "\n::" not in cli("audit", "--format", "json", tree).stdout  # JSON escapes it: a line of its own never


def test_export_into_the_runtime_folder_is_refused(linked_tree, cli):
    """`export --out srt/_patchkit` made every later apply refuse the runtime
    folder ("exists and was not written by patchkit")."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree, "trtllm-mha-overlap-hook").exit_code == 0
    for inside in ("srt/_patchkit", "srt/_patchkit/patches", ".patchkit/series"):
        result = cli("export", tree, "--out", tree / inside)
        assert result.exit_code == 2 and "keeps for itself" in result.output, result.output
    assert not (tree / "srt/_patchkit/0001-trtllm-mha-overlap-hook.patch").exists()
    assert cli("apply", tree).exit_code == 0


def test_the_audit_leaves_a_nested_tree_to_its_own_audit(linked_tree, cli, tmp_path):
    """The outer tree's audit counted a patched tree nested inside it."""
    outer = linked_tree(PRIMARY)
    alone = json.loads(cli("audit", "--format", "json", outer).stdout)
    nested = linked_copy(linked_tree(PRIMARY), outer / "srt" / "vendor" / "sglang")
    assert cli("apply", nested).exit_code == 0
    (nested / "srt" / "extra.py").write_text(READ)
    with_nested = json.loads(cli("audit", "--format", "json", outer).stdout)
    assert with_nested["reads"] == alone["reads"]
