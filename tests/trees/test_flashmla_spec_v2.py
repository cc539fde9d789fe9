"""flashmla-spec-v2 (sglang #31090): before/after snippets for the codemods of
its own (the flags and the tree mask are FA3's, tested there), then the real
trees (0.5.10 .. 0.5.15 patched; 0.5.16+ native)."""

from __future__ import annotations

import json

import pytest
from support import class_section, patch_states, snapshot

FLASHMLA = "srt/layers/attention/flashmla_backend.py"
PATCH = "flashmla-spec-v2"


# -- real trees ----------------------------------------------------------------------------


MARKS = [
    "    needs_cpu_seq_lens: bool = False\n",
    "        self.cuda_graph_custom_mask = None\n",
    "        self.cuda_graph_custom_mask = alloc_verify_tree_mask(\n",
    "    def get_verify_buffers_to_fill_after_draft(self):\n",
    "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)",
    "plus_or_none(forward_batch.seq_lens_cpu, self.num_draft_tokens)",
    "host_max_seq_len(seq_lens_cpu, self.max_context_len)",
    "        elif forward_batch.forward_mode.is_draft_extend_v2():\n",
    "fixed_q_cache_seqlens(forward_batch, self.forward_metadata, self.num_draft_tokens)",
]


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.15"])
def test_release_apply_verify_idempotent_and_exact_revert(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"

    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / FLASHMLA).read_text()
    compile(text, FLASHMLA, "exec")
    for mark in MARKS:
        assert mark in text, mark
    assert "needs_cpu_seq_lens: bool = False" in class_section(text, "FlashMLAMultiStepDraftBackend")
    assert "assert seq_lens_cpu is not None" not in text and "else seq_lens.max().item()" not in text
    assert "ForwardMode.DRAFT_EXTEND_V2" not in class_section(text, "FlashMLABackend").split("def forward_extend")[1]
    for helper in ("fa3", "flashmla", "mirror_reads"):
        assert (tree / f"srt/_patchkit/backends/{helper}.py").is_file()

    st = patch_states(cli, tree, PATCH)
    assert st[PATCH]["state"] == "applied", st[PATCH]
    assert all(st[r]["state"] in ("applied", "native") for r in st[PATCH]["requires"])
    report = json.loads(cli("verify", tree, "--format", "json").output)
    assert {p["id"]: p["ok"] for p in report["patches"]}[PATCH]
    audit = json.loads(cli("audit", tree, "--format", "json").output)
    assert not [r for r in audit["reads"] if r["file"] == FLASHMLA and r["verdict"] in ("unguarded", "stale")]
    patched = snapshot(tree)

    assert cli("apply", tree, PATCH).exit_code == 0
    assert cli("apply", tree, PATCH, "--check").exit_code == 0
    assert snapshot(tree) == patched

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


def flashmla_reads(cli, tree, verdict):
    audit = json.loads(cli("audit", tree, "--format", "json").output)
    return [r for r in audit["reads"] if r["file"] == FLASHMLA and r["verdict"] == verdict]


@pytest.mark.trees
def test_audit_lists_the_reads_of_a_flashmla_that_opts_out_unguarded(make_tree, cli):
    """Pristine FlashMLA keeps the mirror (no opt-out): its reads are safe. A
    fork that declares the flag False without guarding them is what the
    audit catches; this patch leaves none."""
    tree = make_tree("0.5.12.post1")
    assert flashmla_reads(cli, tree, "unguarded") == []
    assert {r["function"] for r in flashmla_reads(cli, tree, "safe")} >= {"FlashMLABackend.init_forward_metadata"}
    path = tree / FLASHMLA
    path.write_text(
        path.read_text().replace(
            "class FlashMLABackend(FlashInferMLAAttnBackend):\n",
            "class FlashMLABackend(FlashInferMLAAttnBackend):\n    needs_cpu_seq_lens: bool = False\n\n",
        )
    )
    assert {r["function"] for r in flashmla_reads(cli, tree, "unguarded")} == {"FlashMLABackend.init_forward_metadata"}
    assert cli("apply", tree, PATCH).exit_code == 0
    assert flashmla_reads(cli, tree, "unguarded") == []
    assert {r["patch"] for r in flashmla_reads(cli, tree, "patched")} == {PATCH}


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.16", "0.5.17", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    st = patch_states(cli, tree, PATCH)
    assert st[PATCH]["state"] == "native", st[PATCH]
    checks = {c["codemod"].split(".")[1]: c["state"] for c in st[PATCH]["checks"]}
    mask_parts = {checks[n] for n in ("InitTreeMask", "AllocTreeMask", "VerifyBuffersReturnTreeMask")}
    assert mask_parts == ({"done"} if version == "0.5.16" else {"superseded"})
    assert cli("apply", tree, PATCH).exit_code == 0
    assert snapshot(tree) == before
