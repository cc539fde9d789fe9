"""Issue 29 §3: the preallocated verify tree mask goes only to a batch it fits.

Snippets for the worker codemods (patchkit.codemods.verify_tree_mask_fits) and
for the backends' record of the captured max_bs, including the upgrade of a
tree patched before the record existed (it must read exactly as a fresh
apply); then real trees: apply, share the worker edit between patches, revert
exactly."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot
from test_verify_tree_mask_fits_snippets import MLA_BACKEND

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

# -- the backends record the captured max_bs; trees patched before that upgrade --------------


RECORD = """        # The mask holds max_bs requests: the spec worker hands it to
        # build_tree_kernel_efficient only for a batch it fits, so an eager
        # batch above the captured size never writes past its end.
        self.verify_tree_mask_max_bs = max_bs
"""


def old_patched(fresh: str) -> str:
    """What patchkit wrote before the record existed."""
    assert fresh.count(RECORD) == 1
    return fresh.replace(RECORD, "")


@pytest.mark.parametrize(
    "codemod, src",
    [
        (mla.AllocCustomMask, MLA_BACKEND),
        (
            fa3.AllocTreeMask,
            MLA_BACKEND.replace("TRTLLMMLABackend", "FlashAttentionBackend")
            .replace("trtllm_mla import alloc_cuda_graph_custom_mask", "fa3 import alloc_verify_tree_mask")
            .replace("\n        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)\n", ""),
        ),
    ],
)
def test_an_old_patched_tree_upgrades_to_exactly_a_fresh_apply(codemod, src):
    fresh = apply(codemod, src)
    assert "self.verify_tree_mask_max_bs = max_bs\n" in fresh
    old = old_patched(fresh)
    finding = detect(codemod, old)
    assert finding.state is State.TODO and "earlier patchkit" in finding.detail
    assert apply(codemod, old) == fresh


# -- real trees ---------------------------------------------------------------------------------

WORKER_FILE = "srt/speculative/eagle_worker_v2.py"
MULTI_FILE = "srt/speculative/multi_layer_eagle_worker_v2.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_real_tree_patches_share_the_worker_guard_and_revert_exactly(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert cli("apply", tree, "fa3-spec-v2").exit_code == 0
    for rel in (WORKER_FILE, MULTI_FILE):
        text = (tree / rel).read_text()
        assert text.count("tree_mask_buf = verify_tree_mask_for_batch(") == 1, rel
        compile(text, rel, "exec")
    assert (
        "self.verify_tree_mask_max_bs = max_bs" in (tree / "srt/layers/attention/flashattention_backend.py").read_text()
    )
    assert (tree / "srt/_patchkit/backends/verify_tree_mask.py").is_file()
    worker = (tree / WORKER_FILE).read_text()

    result = cli("apply", tree, "trtllm-mla-spec-v2")
    assert result.exit_code == 0, result.output
    assert (tree / WORKER_FILE).read_text() == worker  # found done, not written twice
    assert "self.verify_tree_mask_max_bs = max_bs" in (tree / "srt/layers/attention/trtllm_mla_backend.py").read_text()
    states = patch_states(cli, tree, "fa3-spec-v2", "trtllm-mla-spec-v2")
    assert states["fa3-spec-v2"]["state"] == states["trtllm-mla-spec-v2"]["state"] == "applied"

    assert cli("revert", tree, "fa3-spec-v2").exit_code == 0
    assert (tree / WORKER_FILE).read_text() == worker  # trtllm-mla-spec-v2 keeps it
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_real_0_5_13_trtllm_mla_stays_native(make_tree, cli):
    tree = make_tree("0.5.13")
    assert patch_states(cli, tree, "trtllm-mla-spec-v2")["trtllm-mla-spec-v2"]["state"] == "native"
