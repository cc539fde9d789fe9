"""trtllm-mha-spec-v2 (sglang #28106): snippets for every codemod, then the
real trees (0.5.10, 0.5.12.post1, 0.5.13 patched; 0.5.14+ native)."""

from __future__ import annotations

import json

import pytest
from support import snapshot

MHA = "srt/layers/attention/trtllm_mha_backend.py"
PATCH = "trtllm-mha-spec-v2"


# -- real trees ----------------------------------------------------------------------------


def states(cli, tree) -> dict[str, dict]:
    result = cli("status", tree, PATCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.13"])
def test_release_apply_verify_idempotent_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert states(cli, tree)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MHA).read_text()
    compile(text, MHA, "exec")
    assert text.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)" in text
    assert "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)" in text
    assert "from sglang.srt._patchkit.backends.mirror_reads import" in text
    st = states(cli, tree)
    assert st[PATCH]["state"] == "applied"
    assert {st[r]["state"] for r in st[PATCH]["requires"]} <= {"applied", "native"}
    patched = snapshot(tree)
    assert cli("apply", tree, PATCH, "--check").exit_code == 0
    assert snapshot(tree) == patched
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_with_draft_extend_v2_on_the_same_methods(linked_tree, cli):
    """trtllm-mha-draft-extend-v2 edits the same replay method: either order of
    revert leaves the other patch applied and exact."""
    tree = linked_tree("0.5.12.post1")
    before = snapshot(tree)
    assert cli("apply", tree, PATCH, "trtllm-mha-draft-extend-v2").exit_code == 0
    both = (tree / MHA).read_text()
    assert "fill_draft_extend_v2_cu_seqlens_q" in both and "rows_or_none(seq_lens_cpu, bs)" in both
    assert cli("revert", tree, PATCH).exit_code == 0
    alone = (tree / MHA).read_text()
    assert "fill_draft_extend_v2_cu_seqlens_q" in alone and "rows_or_none" not in alone
    assert cli("apply", tree, PATCH).exit_code == 0
    assert (tree / MHA).read_text() == both
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.14", "0.5.15", "0.5.16", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert states(cli, tree)[PATCH]["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0
    # 0.5.14 and 0.5.15 lack upstream's runner fix: the required
    # replay-no-stale-mirror is applied there, nothing of this patch.
    after = snapshot(tree)
    assert after[MHA] == before[MHA]
    if version in ("0.5.16", "0.5.23"):
        assert after == before
