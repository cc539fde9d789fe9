"""trtllm-mla-spec-v2 (#26824) and trtllm-mla-draft-skip-template (#26241):
before/after snippets for every codemod, then the real trees."""

from __future__ import annotations

import json

import pytest
from support import NATIVE, PRE_UPSTREAM, class_section, patch_states, snapshot

MLA = "srt/layers/attention/trtllm_mla_backend.py"
SPEC = "trtllm-mla-spec-v2"
SKIP = "trtllm-mla-draft-skip-template"


# --- real trees -----------------------------------------------------------------------


def verify_ok(cli, tree) -> dict[str, bool]:
    """`verify` over every patch; ours (and what they require) must be ok."""
    result = cli("verify", tree, "--format", "json")
    return {p["id"]: p["ok"] for p in json.loads(result.output)["patches"]}


SPEC_MARKS = [
    "    needs_cpu_seq_lens: bool = False\n",
    "        self.cuda_graph_custom_mask = None\n",
    "        self.cuda_graph_custom_mask = alloc_cuda_graph_custom_mask(\n",
    "    def get_verify_buffers_to_fill_after_draft(self):\n",
    "from sglang.srt._patchkit.backends.trtllm_mla import alloc_cuda_graph_custom_mask\n",
]
SKIP_MARKS = [
    "    def init_forward_metadata(self, forward_batch: ForwardBatch):\n        # Skip common_template",
    "    def init_forward_metadata_replay_cuda_graph(\n        self, forward_batch: ForwardBatch, bs: int\n    ):\n",
]


def check_items(text: str, spec_on: bool, skip_on: bool) -> None:
    compile(text, MLA, "exec")
    for mark in SPEC_MARKS:
        assert (mark in text) is spec_on, mark
    for mark in SKIP_MARKS:
        assert (mark in text) is skip_on, mark
    draft = class_section(text, "TRTLLMMLAMultiStepDraftBackend")
    assert ("needs_cpu_seq_lens: bool = False" in draft) is spec_on
    if spec_on:  # allocated before the parent's init_cuda_graph_state runs
        backend = class_section(text, "TRTLLMMLABackend")
        assert backend.index("alloc_cuda_graph_custom_mask(") < backend.index("super().init_cuda_graph_state(")


@pytest.mark.trees
@pytest.mark.parametrize("version", PRE_UPSTREAM)
def test_release_apply_verify_idempotent_partial_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert {p: s["state"] for p, s in patch_states(cli, tree, SPEC, SKIP).items() if p in (SPEC, SKIP)} == {
        SPEC: "absent",
        SKIP: "absent",
    }

    result = cli("apply", tree, SPEC, SKIP)
    assert result.exit_code == 0, result.output
    patched = (tree / MLA).read_bytes()
    check_items(patched.decode(), spec_on=True, skip_on=True)
    st = patch_states(cli, tree, SPEC, SKIP)
    assert st[SPEC]["state"] == st[SKIP]["state"] == "applied"
    ok = verify_ok(cli, tree)
    assert ok[SPEC] and ok[SKIP] and all(ok[r] for r in st[SPEC]["requires"])
    after = snapshot(tree)

    # Idempotent.
    assert cli("apply", tree, SPEC, SKIP).exit_code == 0
    assert cli("apply", tree, SPEC, SKIP, "--check").exit_code == 0
    assert snapshot(tree) == after

    # Revert one, the other stays applied (and vice versa).
    assert cli("revert", tree, SKIP).exit_code == 0
    check_items((tree / MLA).read_text(), spec_on=True, skip_on=False)
    st = patch_states(cli, tree, SPEC, SKIP)
    assert (st[SPEC]["state"], st[SKIP]["state"]) == ("applied", "absent")
    assert cli("apply", tree, SKIP).exit_code == 0
    assert (tree / MLA).read_bytes() == patched

    assert cli("revert", tree, SPEC).exit_code == 0
    check_items((tree / MLA).read_text(), spec_on=False, skip_on=True)
    st = patch_states(cli, tree, SPEC, SKIP)
    assert (st[SPEC]["state"], st[SKIP]["state"]) == ("absent", "applied")

    # Exact revert, byte for byte.
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", [NATIVE, "0.5.17", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    st = patch_states(cli, tree, SPEC, SKIP)
    assert st[SPEC]["state"] == "native", st[SPEC]
    assert st[SKIP]["state"] == "native", st[SKIP]
    checks = {c["codemod"].split(".")[1]: c for c in st[SPEC]["checks"]}
    mask_parts = ("InitCustomMask", "AllocCustomMask", "VerifyBuffersReturnCustomMask")
    expected = "done" if version == NATIVE else "superseded"
    assert {checks[name]["state"] for name in mask_parts} == {expected}
    assert st[SPEC]["ok"] and st[SKIP]["ok"]
    assert cli("apply", tree, SPEC, SKIP).exit_code == 0
    assert snapshot(tree) == before
