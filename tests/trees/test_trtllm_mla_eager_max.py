"""trtllm-mla-spec-v2's eager max without the mirror (sglang 0.5.16): once
TRT-LLM MLA opts out of the mirror, ``init_forward_metadata`` must not read
``forward_batch.seq_lens.max().item()`` (a host wait every eager step):
snippets, fork spellings, then the real patched module (no ``.item()`` left
in the method)."""

from __future__ import annotations

import pytest
from support import NATIVE, PRE_UPSTREAM, patch_states
from test_trtllm_mla_eager_max_snippets import item_calls

MLA = "srt/layers/attention/trtllm_mla_backend.py"
SPEC = "trtllm-mla-spec-v2"


# --- the real module -------------------------------------------------------------------


@pytest.mark.trees
@pytest.mark.parametrize("version", PRE_UPSTREAM)
def test_patched_module_has_no_item_left_in_init_forward_metadata(linked_tree, cli, version):
    tree = linked_tree(version)
    assert item_calls((tree / MLA).read_text()), "pristine reads the max with .item()"
    assert cli("apply", tree, SPEC).exit_code == 0
    assert item_calls((tree / MLA).read_text()) == []
    assert patch_states(cli, tree, SPEC)[SPEC]["state"] == "applied"


@pytest.mark.trees
@pytest.mark.parametrize("version, state", [(NATIVE, "superseded"), ("0.5.17", "done"), ("0.5.23", "done")])
def test_upstream_releases(linked_tree, cli, version, state):
    st = patch_states(cli, linked_tree(version), SPEC)[SPEC]
    assert st["state"] == "native"
    checks = {c["codemod"].split(".")[1]: c["state"] for c in st["checks"]}
    assert checks["EagerMaxWithoutMirror"] == state
