"""fa3-spec-v2 (sglang #29343, #29589, #31364, #31527): before/after snippets
for every codemod, then the real trees (0.5.10, 0.5.12.post1, 0.5.14, 0.5.15
patched; 0.5.16 and 0.5.17 native)."""

from __future__ import annotations

import json

import pytest
from support import PRIMARY, class_section, patch_states, snapshot

FA3 = "srt/layers/attention/flashattention_backend.py"
PATCH = "fa3-spec-v2"
HELPERS = "from sglang.srt._patchkit.backends.fa3 import"


# -- real trees ----------------------------------------------------------------------------


MARKS = [
    "    needs_cpu_seq_lens: bool = False\n",
    "        self.cuda_graph_custom_mask = None\n",
    "        self.cuda_graph_custom_mask = alloc_verify_tree_mask(\n",
    "    def get_verify_buffers_to_fill_after_draft(self):\n",
    "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)",
    "host_max_seq_len(seq_lens_cpu, self.max_context_len)",
    "any_host_lens(forward_batch.extend_prefix_lens_cpu)",
]
#: Files whose replay hands the backend the pinned buffer, per release.
RUNNERS = {
    "0.5.10": ["srt/model_executor/cuda_graph_runner.py", "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"],
    "0.5.12.post1": [
        "srt/model_executor/cuda_graph_runner.py",
        "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    ],
    "0.5.14": [
        "srt/model_executor/runner/decode_cuda_graph_runner.py",
        "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    ],
    "0.5.15": [
        "srt/model_executor/runner/decode_cuda_graph_runner.py",
        "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    ],
}


@pytest.mark.trees
@pytest.mark.parametrize("version", sorted(RUNNERS))
def test_release_apply_verify_idempotent_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    # 0.5.15 already had part of it (the draft-decode page table on the
    # device, replay's None-guarded slice): partial there.
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == ("partial" if version == "0.5.15" else "absent")

    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / FA3).read_text()
    compile(text, FA3, "exec")
    for mark in MARKS:
        if version == "0.5.15" and mark.startswith("host_max_seq_len(forward_batch"):
            continue  # 0.5.15 reads a local mirror variable instead
        assert mark in text, mark
    assert "needs_cpu_seq_lens: bool = False" in class_section(text, "FlashAttentionMultiStepBackend")
    for rel in RUNNERS[version]:
        assert "mirror_or_none(forward_batch.seq_lens_cpu, buffers.seq_lens_cpu" in (tree / rel).read_text(), rel
    assert (tree / "srt/_patchkit/backends/fa3.py").is_file() and (
        tree / "srt/_patchkit/backends/mirror_reads.py"
    ).is_file()
    assert f"{HELPERS} alloc_verify_tree_mask, verify_buffers\n" in text and "mirror_or_none" not in text
    assert "from sglang.srt._patchkit.backends.mirror_reads import" in text

    st = patch_states(cli, tree, PATCH)
    assert st[PATCH]["state"] == "applied", st[PATCH]
    assert all(st[r]["state"] in ("applied", "native") for r in st[PATCH]["requires"])
    verify = {p["id"]: p["ok"] for p in json.loads(cli("verify", tree, "--format", "json").output)["patches"]}
    assert verify[PATCH] and verify["needs-cpu-seq-lens"]
    patched = snapshot(tree)

    assert cli("apply", tree, PATCH).exit_code == 0
    assert cli("apply", tree, PATCH, "--check").exit_code == 0
    assert snapshot(tree) == patched

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.16", "0.5.17", "0.5.19", "0.5.20", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    st = patch_states(cli, tree, PATCH)
    assert st[PATCH]["state"] == "native", st[PATCH]
    checks = {c["codemod"].split(".")[1]: c["state"] for c in st[PATCH]["checks"]}
    mask_parts = {checks[n] for n in ("InitTreeMask", "AllocTreeMask", "VerifyBuffersReturnTreeMask")}
    assert mask_parts == ({"done"} if version == "0.5.16" else {"superseded"})
    assert cli("apply", tree, PATCH).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_every_patch_together_on_the_primary_release(linked_tree, cli):
    tree = linked_tree(PRIMARY)
    before = snapshot(tree)
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    assert "applied: fa3-spec-v2" in result.output
    assert cli("verify", tree).exit_code == 0
    runner = (tree / "srt/model_executor/cuda_graph_runner.py").read_text()
    # needs-cpu-seq-lens' guard and ours, side by side in the same call.
    assert "add_or_none(forward_batch.seq_lens_sum" in runner and "mirror_or_none(forward_batch.seq_lens_cpu" in runner
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before
